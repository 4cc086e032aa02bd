"""Who may call which op: one table, enforced in one place.

Every op served under ``/v1`` has one entry here saying

* the lowest **role** that may call it (viewer < writer < admin);
* which **token scopes** may call it: a namespace-wide token (read scope ``all``) always
  may, with the role; a token bound to one user (``own_user``, the end-user token) or to
  one session (``own_session``) may only where the entry's :class:`Bounded` says so;
* what a bounded token **sees** there, and who owns what the op changes (for the docs).

``loom.api.deps.authorized`` applies :func:`check` to every request before the route
runs, for the HTTP API and so for the MCP tools and the dashboard, which call the API's
own routes in-process with the caller's token. The app refuses to start while a route
has no entry or does not depend on ``authorized`` (:func:`verify_routes`), so a new op is
not served until it is written down here. docs/security.md is rendered from this table
(:func:`render_markdown`), and a test keeps the two equal.

Checks that need the stored row (a writer deleting only the turns its own token
appended, say) stay in the op, which reads the row; the entry's ``owns`` says what they
are, and the op enforces them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from loom.auth.principal import Principal, Role
from loom.errors import Forbidden


class Bounded(StrEnum):
    """What a token bound to one user or session may do with an op."""

    REFUSED = "refused"  # 403: the op reads or changes what has no user axis to bound
    OWN_USER = "own_user"  # an own_user token acts as its user only; own_session refused
    OWN_SCOPE = "own_scope"  # own_user and own_session tokens act in their user (and session)


@dataclass(frozen=True, kw_only=True)
class Rule:
    op: str
    role: Role
    bounded: Bounded
    sees: str = ""  # what a bounded token sees (when it may call the op)
    owns: str = ""  # record-level rules the op applies after reading the row

    def allows(self, who: Principal) -> bool:
        try:
            check_rule(self, who)
        except Forbidden:
            return False
        return True


# Plain language for what a token bound to one user sees on the memory ops.
_OWN_FACTS = "only its own user's facts (a session token: that session's); a body naming another user is 403"
_OWN_SAVED = "only its own user's saved messages; a body naming another user_id is 403"
_THREAD = "refused: a thread mixes users and has no user axis to bound"


def _r(op: str, role: Role, bounded: Bounded, sees: str = "", owns: str = "") -> Rule:
    return Rule(op=op, role=role, bounded=bounded, sees=sees, owns=owns)


V, W, A = Role.viewer, Role.writer, Role.admin
REFUSED, OWN_USER, OWN_SCOPE = Bounded.REFUSED, Bounded.OWN_USER, Bounded.OWN_SCOPE


def _thread_op(op: str, role: Role) -> Rule:
    """A transcript op: a thread mixes users, so a bounded token may not call it."""
    return _r(op, role, REFUSED, _THREAD)


def _facts_op(op: str, role: Role) -> Rule:
    """An op on a user's facts: a bounded token acts as its user (and session)."""
    return _r(op, role, OWN_SCOPE, _OWN_FACTS)


def _operator_op(op: str) -> Rule:
    """An operator's op: a namespace-wide admin's only."""
    return _r(op, A, REFUSED, "refused")


RULES: tuple[Rule, ...] = (
    # The conversation plane: a thread mixes users, so every transcript op refuses
    # bounded tokens; the saved-message ops are per user and act as the token's user.
    _thread_op("conversation.append", W),
    _thread_op("conversation.create", W),
    _thread_op("conversation.update", W),
    _thread_op("conversation.threads", V),
    _thread_op("conversation.get", V),
    _thread_op("conversation.list", V),
    _thread_op("conversation.search", V),
    _thread_op("conversation.compact", W),
    _thread_op("conversation.compact_status", W),
    _thread_op("conversation.delete", A),
    _r(
        "conversation.delete_message",
        W,
        OWN_USER,
        "its own saved message only, and then it unsaves: the saved copy and its indexes go, a row "
        "that existed only because of the save goes with them, a recorded turn stays; anything "
        "else answers found: false",
        "an admin removes any turn; a writer only the turns its own token appended",
    ),
    _thread_op("conversation.redact", A),
    _thread_op("conversation.reembed", A),
    _thread_op("conversation.high_turns", A),
    _r("conversation.set_logging", A, REFUSED, "refused: recording is the owner's choice"),
    _r(
        "conversation.save_message",
        W,
        OWN_USER,
        _OWN_SAVED,
        "a save claims only a row no user owns or the caller's user owns (else owner_mismatch)",
    ),
    _r(
        "conversation.unsave_message",
        W,
        OWN_USER,
        _OWN_SAVED,
        "found: false for a message another user saved",
    ),
    _r("conversation.list_saved_messages", V, OWN_USER, _OWN_SAVED),
    _r("conversation.saved_status", V, OWN_USER, _OWN_SAVED),
    _r("conversation.search_saved_messages", V, OWN_USER, _OWN_SAVED),
    # Session briefs: a bounded token keeps its briefs under its own prefix.
    _r("session.brief_save", W, OWN_SCOPE, "writes only its own briefs (stored as ~user~key)"),
    _r("session.brief_get", V, OWN_SCOPE, "only its own briefs; a '~' key is 403"),
    _r("session.brief_list", V, OWN_SCOPE, "only its own briefs, shown without their prefix"),
    _r(
        "session.brief_delete",
        W,
        OWN_SCOPE,
        "only briefs scoped to its own user (or session)",
        "an admin deletes any brief; a writer only a brief every revision of which its own token wrote",
    ),
    # Memory: per user; a bounded token acts as its user (and session).
    _facts_op("memory.set", W),
    _facts_op("memory.search", V),
    _facts_op("memory.list", W),
    _facts_op("memory.delete", W),
    _facts_op("memory.history", V),
    _r(
        "memory.profile",
        V,
        OWN_SCOPE,
        "only its own user's profile (a session token: built from that session)",
    ),
    _facts_op("memory.set_from_messages", W),
    _r("memory.recall", V, OWN_SCOPE, "only its own user's evidence"),
    _r("memory.ask", V, OWN_SCOPE, "answered from its own user's memory only"),
    _r("memory.job_status", V, OWN_SCOPE, "only its own user's (and session's) jobs"),
    _facts_op("observe.record", W),
    _facts_op("observe.crystallize", W),
    _r(
        "context.pack",
        V,
        OWN_SCOPE,
        "its own user's facts, evidence and briefs; never a transcript (note bounded_token)",
    ),
    _r("search", V, OWN_SCOPE, "the memory section for its own user; never the conversation section"),
    # The namespace and the deploy.
    _r("namespace.get_config", V, OWN_SCOPE, "the namespace's recording switch and policy (no user data)"),
    _operator_op("namespace.set_policy"),
    _r("replicas.show", V, OWN_SCOPE, "what the deploy's replicas share (no user data)"),
    # Operators: namespace-wide admins only.
    _operator_op("erasure.request"),
    _operator_op("erasure.status"),
    _operator_op("erasure.export"),
    _operator_op("retention.show"),
    _operator_op("health.show"),
    _operator_op("settings.get"),
    _operator_op("settings.set"),
    _operator_op("webhook.register"),
    _operator_op("webhook.list"),
    _operator_op("webhook.delete"),
    _operator_op("webhook.rotate_secret"),
    _operator_op("webhook.deliveries"),
    # Import and export: a whole namespace's history in or out.
    _operator_op("import.start"),
    _operator_op("import.write"),
    _operator_op("import.status"),
    _operator_op("export.start"),
)

POLICY: dict[str, Rule] = {r.op: r for r in RULES}
assert len(POLICY) == len(RULES), "an op is listed twice in loom.auth.policy"


class PolicyError(RuntimeError):
    """The app's routes and this table disagree: the app does not start."""


def rule_for(op: str) -> Rule:
    found = POLICY.get(op)
    if found is None:
        # verify_routes keeps this from being reached by a served route.
        raise Forbidden(f"op {op!r} has no authorization entry", rule="policy")
    return found


def check(op: str, who: Principal) -> None:
    """Raise Forbidden unless `who` may call `op` (its role, then its read scope)."""
    check_rule(rule_for(op), who)


def check_rule(rule: Rule, who: Principal) -> None:
    who.require_role(rule.role)
    if not who.bounded or rule.bounded is Bounded.OWN_SCOPE:
        return
    if rule.bounded is Bounded.REFUSED:
        raise Forbidden("a token bound to one user or session cannot call this op", rule="read_scope")
    if who.read_scope != "own_user":
        raise Forbidden(
            "an own_session token cannot call this op: conversation rows have no session",
            rule="read_scope",
        )


def verify_routes(ops: Iterable[tuple[str, bool]]) -> None:
    """(op, guarded) for every served op: each must have an entry and be guarded by the
    one dependency; every entry must name a served op."""
    served: set[str] = set()
    for op, guarded in ops:
        served.add(op)
        if op not in POLICY:
            raise PolicyError(f"op {op!r} is served but has no entry in loom.auth.policy: add one")
        if not guarded:
            raise PolicyError(f"op {op!r} is served without the authorization dependency (loom.api.deps)")
    stale = sorted(set(POLICY) - served)
    if stale:
        raise PolicyError(f"loom.auth.policy lists ops no route serves: {', '.join(stale)}")


TOKEN_KINDS: tuple[tuple[str, str], ...] = (
    ("admin", "a namespace-wide token with the admin role: every op of its namespaces"),
    ("writer", "a namespace-wide token with the writer role: every viewer and writer op of its namespaces"),
    ("viewer", "a namespace-wide token with the viewer role: the read ops of its namespaces"),
    (
        "own_user",
        "an end-user token (`--read-scope own_user --read-user-id U`): acts as user U only, "
        'on the ops marked own_user or own_scope; `namespace: "@me"` names its namespace',
    ),
    (
        "own_session",
        "a token bound to one session of one user (`--read-scope own_session`): the ops marked "
        "own_scope only, within that session",
    ),
    (
        "revoked, expired or malformed",
        "401 on every op, before the body is read (`loom token revoke`; `loom token mint --expires-in 30d` "
        "gives a token a lifetime)",
    ),
    ("another namespace's token", "403 naming `namespace` on every op of a namespace it does not grant"),
)


def render_markdown() -> str:
    """docs/security.md's body (a test checks the committed file equals it)."""
    lines = [
        "# Security: who may do what",
        "",
        "<!-- Generated from loom/auth/policy.py by `python -m loom.auth.policy`; a test keeps it current. -->",
        "",
        "Every op checks the caller's bearer token before it reads the request body: the token",
        "must be valid (not revoked, not expired), grant the namespace asked for, carry the op's",
        "role, and have a read scope the op admits. One table (`loom/auth/policy.py`) says all of",
        "it, and one dependency enforces it for the HTTP API, the MCP tools and the dashboard",
        "(both call the API's own routes with the caller's token). An op with no entry is not",
        "served: the API refuses to start.",
        "",
        "An end-user token never reads another user's words or a transcript turn no user owns,",
        "through any op, answer, error or webhook.",
        "",
        "## Token kinds",
        "",
        "| token | may |",
        "|---|---|",
        *[f"| {name} | {text} |" for name, text in TOKEN_KINDS],
        "",
        "## Bounded tokens",
        "",
        "- **refused**: a token bound to one user or session gets 403 (`rule: read_scope`).",
        "- **own_user**: an own_user token acts as its user only; an own_session token gets 403",
        "  (conversation rows have no session).",
        "- **own_scope**: own_user and own_session tokens act within their user (and session).",
        "",
        "## The table",
        "",
        "| op | role | bounded token | what a bounded token sees | owner rule |",
        "|---|---|---|---|---|",
        *[
            f"| `{r.op}` | {r.role.name} | {r.bounded.value} | {r.sees or '-'} | {r.owns or '-'} |"
            for r in RULES
        ],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
