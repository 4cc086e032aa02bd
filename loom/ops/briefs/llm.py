"""Revising a brief with a model: which model, the prompt, and the output contract.

Which model (LOOM_SESSION_BRIEF_LLM on):

1. LOOM_SESSION_BRIEF_LLM_MODEL with LOOM_SESSION_BRIEF_LLM_API_KEY: that model, over
   the OpenAI-compatible provider at LOOM_SESSION_BRIEF_LLM_URL if the settings have
   one (they do not yet), else at LOOM_LLM_URL, else at https://api.openai.com;
2. else the deployment's LLM (``svc.llm``) when it is configured;
3. else none: the deterministic builder (see ops.py).

The output contract (strict JSON, one object, nothing else)::

    {"goal": str, "status": str,
     "open_questions": [str], "next_steps": [str], "key_files": [str],
     "constraints": [str], "pointers": [str],
     "new_decisions": [str], "new_dead_ends": [str], "new_done": [str]}

State keys that are present replace the section; a missing state key leaves it as it
was. ``new_*`` items are appended to the accumulating sections. The parser accepts the
object inside a Markdown code fence or surrounded by prose, but anything that is not one
JSON object with at least one known key of the right type (strings, lists of strings)
fails the window.
"""

from __future__ import annotations

import json
import re
from typing import Any

from loom.ops.briefs.model import ACCUMULATING, LIST_CAPS, STATE_LISTS, TEXT_CAPS, Patch, Sections
from loom.providers.llm import LLM, ChatMessage, build_llm
from loom.services import Services, Slot
from loom.settings import Settings

MAX_TOKENS = 2_000
DEFAULT_URL = "https://api.openai.com"  # a brief model's key with no URL configured anywhere
# The process's brief model client and what it was built from (URL, key, model, timeout).
_CLIENT: Slot[tuple[tuple[str, str, str, float], LLM]] = Slot("briefs.llm")

ADDED_KEYS = {f"new_{name}": name for name in ACCUMULATING}


class ReplyError(ValueError):
    """The model's answer does not follow the contract: the window failed."""


def pick_llm(svc: Services, settings: Settings) -> tuple[LLM | None, str | None]:
    """The model that revises briefs and the model name to ask for, or (None, None)."""
    if not settings.session_brief_llm:
        return None, None
    model = settings.session_brief_llm_model
    key = settings.session_brief_llm_api_key
    url = str(getattr(settings, "session_brief_llm_url", "") or settings.llm_url or DEFAULT_URL)
    if model and key:
        ident = (url, key, model, settings.llm_timeout_seconds)
        cached = _CLIENT.get(svc)
        if cached is None or cached[0] != ident:
            llm = build_llm(
                "openai", base_url=url, api_key=key, model=model, timeout=settings.llm_timeout_seconds
            )
            cached = (ident, llm)
            _CLIENT.put(svc, cached)
        return cached[1], model
    if svc.llm.configured:
        return svc.llm, None
    return None, None


def _contract() -> str:
    caps = ", ".join(f"{name} at most {cap.items} items" for name, cap in LIST_CAPS.items())
    return (
        "You maintain a session brief: the resumable state of one line of work (usually a coding "
        "session), read by whoever resumes it after a compaction, the next day, or by a teammate.\n"
        "You get the brief as it is now (JSON) and the events since (one per line: [kind] path (exit N): "
        "text). Revise the brief from the events.\n\n"
        "Answer with ONE JSON object and nothing else, with these keys:\n"
        '  "goal": string, what this line of work is for (one sentence);\n'
        '  "status": string, where things stand now (a few short lines);\n'
        '  "open_questions", "next_steps", "key_files", "constraints", "pointers": arrays of strings, '
        "the full current list for each (they replace the old lists; repeat items that still hold);\n"
        '  "new_decisions", "new_dead_ends", "new_done": arrays of strings, ONLY items the events add '
        "(decisions taken and why, approaches tried that failed and why, things finished); never repeat "
        "items the brief already has.\n"
        "Lists are oldest first; short items (one line each); "
        f"goal at most {TEXT_CAPS['goal']} characters, status at most {TEXT_CAPS['status']}; {caps}.\n"
        "Keep what the brief says unless the events change it. Never copy secrets, keys, passwords or "
        "personal numbers into the brief."
    )


SYSTEM_PROMPT = _contract()


def messages_for(current: Sections, window_text: str, index: int, count: int) -> list[ChatMessage]:
    brief = json.dumps(current.to_dict(), ensure_ascii=False, indent=1)
    user = (
        f"Current brief:\n{brief}\n\nEvents (window {index} of {count}):\n{window_text}\n\n"
        "Answer with the JSON object only."
    )
    return [ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", user)]


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def _candidates(text: str) -> list[str]:
    out = [text.strip()]
    out += [m.group(1).strip() for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        out.append(text[start : end + 1])
    return out


def _strings(value: Any, key: str) -> list[str]:
    if not isinstance(value, list):
        raise ReplyError(f"{key} must be an array of strings")
    out: list[str] = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            out.append(str(item))
        else:
            raise ReplyError(f"{key} must be an array of strings")
    return out


def parse_reply(text: str) -> Patch:
    """The model's answer as a patch, or ReplyError."""
    data: Any = None
    for candidate in _candidates(text or ""):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            break
        data = None
    if not isinstance(data, dict):
        raise ReplyError("the answer holds no JSON object")
    state: dict[str, Any] = {}
    added: dict[str, list[str]] = {}
    known = 0
    for name in TEXT_CAPS:
        if name in data and data[name] is not None:
            if not isinstance(data[name], str):
                raise ReplyError(f"{name} must be a string")
            state[name] = data[name]
            known += 1
    for name in STATE_LISTS:
        if name in data and data[name] is not None:
            state[name] = _strings(data[name], name)
            known += 1
    for key, name in ADDED_KEYS.items():
        if key in data and data[key] is not None:
            added[name] = _strings(data[key], key)
            known += 1
    if not known:
        raise ReplyError("the answer has none of the brief's keys")
    return Patch(state, {k: v for k, v in added.items() if v})
