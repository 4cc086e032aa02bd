"""Session briefs: the condensed, resumable state of one line of work.

A brief is never embedded and never returned by a memory or conversation search; only
these ops read it. Modules: ``model`` (sections, caps, rendering), ``keys``
(addressing), ``events`` (events, sensitivity screen, windows), ``builder`` (the
deterministic builder), ``llm`` (model choice, prompt, output contract), ``ops``.

How a save is revised, and the decisions taken where the rules leave room:

* **Which path revises the events.** In this order:

  1. An **operator's extraction policy** on the namespace: nothing is taken from the
     events, neither by a model nor by the deterministic builder, and no client summary
     is kept from them.
  2. ``use_llm: false`` from the client, or the namespace's **model calls switched
     off** (``model_calls_enabled``): nothing is taken from the events.
  3. A model: LOOM_SESSION_BRIEF_LLM on and either LOOM_SESSION_BRIEF_LLM_MODEL with its
     key, or the deployment's configured LLM. It revises once per window (author
     ``llm``).
  4. Otherwise, i.e. the deployment has **no LLM at all** for briefs (the stock fake
     LLM and no brief model, or LOOM_SESSION_BRIEF_LLM off): the **deterministic
     builder** writes goal, status, key files, errors (in the status) and pointers, never
     decisions or dead ends (author ``deterministic``).

  The rules say both "with no LLM the deterministic builder writes ..." and "a save of
  events alone with no model to call (none configured, ``use_llm: false``, or the org's
  model calls switched off ...) writes nothing". We read "no LLM" as the deployment
  level (the builder exists so a default deployment with the fake LLM still gets
  briefs from the coding plugins' events), and "no model to call" as the request's and
  the namespace's choices: the client's ``use_llm: false``, the org's switch, and the
  extraction policy. Those give ``changed: false, reason: "not-revised"`` for events
  alone. LOOM_SESSION_BRIEF_LLM=false counts as "no LLM for briefs" (deterministic),
  since it is the operator's deployment-level choice not to spend model calls here.

* **Windows.** The model revises once per window of LOOM_SESSION_BRIEF_WINDOW_CHARS
  characters of rendered event lines, at most LOOM_SESSION_BRIEF_MAX_WINDOWS; beyond
  that the oldest events are dropped (``events_dropped``). Before every window after
  the first the namespace switch is read again: switched off, the save keeps the
  windows already revised and revises no more (nothing revised yet: not-revised); a
  switch that cannot be read holds that window (counted as failed). A window whose
  call failed, timed out or answered off contract is skipped and the rest revised.
  Events alone with no window revised (all failed) is a 503 for the client to resend.

* **Sections with events.** A save that also carries the agent's sections applies them
  last (author ``model``): over the model's or the builder's revision when there was
  one, and over the brief as it was when the events gave nothing (not-revised or every
  window failed), in which case nothing (not even a summary) is taken from the events.

* **Sensitivity.** Events whose text or path reads as high are withheld before
  anything reads them: never in a prompt, never read by the builder, never kept as the
  summary. Items of the current brief that read as high are left out of the prompt too
  (the agent may have written them); the model's state lists replace the old ones, so
  such a state item does not survive a model revision, while accumulated ones do.

* **Summary.** The last ``summary`` event of a save whose events were taken is kept
  verbatim as the client's last compaction summary; ``brief_get(full=true)`` appends it
  below the brief (for ``revision=N``, the summary as of that revision).

* **Deterministic builder state.** It carries forward what it cannot judge: the goal is
  set only while the brief has none, key files and pointers are the earlier ones plus
  the new ones (newest last, capped); open questions, next steps and constraints stay.

* **Retries, CAS and concurrency.** A save repeating the brief's last ``session_id``
  and non-empty ``event_cursor`` is a retry: nothing written (``reason: "retry"``),
  checked before ``if_revision`` so a retried CAS save does not get a 409.
  ``if_revision=N`` writes only at revision N (0: only a new brief), else 409 with
  ``current_revision``. Provider calls happen before the Redis lease on
  (namespace, stored key) is taken; under it the brief is read again, the retry and CAS
  checks repeated and the revision applied to the fresh brief (state replaced,
  accumulated items appended), so of two concurrent CAS saves exactly one wins and
  concurrent saves without CAS never lose each other's accumulated items. A save that
  changes nothing writes nothing (``reason: "unchanged"``).

* **Keys.** See ``keys.py``. Bounded tokens see only their own briefs. ``mine_only``
  lists briefs with a revision written by the caller's user (a bounded token's user, or
  the request's ``user_id``), else by the calling token.

* **Delete.** Forgets the brief: its revisions are removed and the current row becomes
  an empty tombstone that keeps the revision count, so a later save on the same key
  continues the numbering (revision numbers are never reused).
"""

from loom.ops.briefs.ops import (
    ListItem,
    brief_delete,
    brief_get,
    brief_list,
    save,
)

__all__ = [
    "ListItem",
    "brief_delete",
    "brief_get",
    "brief_list",
    "save",
]
