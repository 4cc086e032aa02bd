#!/usr/bin/env bash
# Loom's capture for the Codex CLI: its `notify` program. Codex runs it after each agent
# turn with a JSON argument naming the session ("thread-id"); this finds that session's
# file (CODEX_HOME/sessions/.../rollout-*-<id>.jsonl) and hands it to
# `loom ingest-transcript --format codex` (thread codex/<id>, agent codex). Each turn
# has a stable id, so running it after every turn stores each turn once.
#
# Never blocks Codex: bounded by LOOM_HOOK_TIMEOUT_S (default 10), failures on stderr,
# always exit 0; what failed is sent next time.
# Environment: LOOM_URL, LOOM_TOKEN, LOOM_NAMESPACE (default "default"), LOOM_USER_ID,
# LOOM_CAPTURE_CONVERSATIONS=false (off), LOOM_BIN (default: loom on PATH, else the
# clone's .venv/bin/loom), CODEX_HOME
# (default ~/.codex).
set -u
[ "${LOOM_CAPTURE_CONVERSATIONS:-true}" = "false" ] && exit 0
[ -n "${LOOM_TOKEN:-}" ] || { echo "loom: LOOM_TOKEN is not set; nothing captured" >&2; exit 0; }
notice="${*: -1}"
session=$(printf '%s' "$notice" | python3 -c '
import json, sys
try:
    n = json.load(sys.stdin)
except ValueError:
    n = {}
v = n.get("thread-id") or n.get("session-id") or n.get("conversation-id") if isinstance(n, dict) else ""
print(v if isinstance(v, str) else "")' 2>/dev/null)
sessions="${CODEX_HOME:-$HOME/.codex}/sessions"
if [ -n "$session" ]; then
  file=$(find "$sessions" -name "rollout-*${session}.jsonl" 2>/dev/null | sort | tail -n 1)
else  # an older Codex that names no session: its newest session file
  file=$(find "$sessions" -name 'rollout-*.jsonl' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2-)
  session=$(basename "${file%.jsonl}" | grep -oE '[0-9a-f]{8}-[0-9a-f-]{27}$')
fi
[ -n "$file" ] && [ -f "$file" ] || { echo "loom: no Codex session file found" >&2; exit 0; }

args=(ingest-transcript --namespace "${LOOM_NAMESPACE:-default}" --file "$file" --format codex
      --thread-id "codex/${session:-$(basename "$file" .jsonl)}" --agent codex)
[ -n "${LOOM_USER_ID:-}" ] && args+=(--user-id "$LOOM_USER_ID")
# The loom command: LOOM_BIN, else `loom` on PATH, else the .venv of the clone this script is in.
loom_bin=${LOOM_BIN:-$(command -v loom || echo "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/loom")}
[ -f "$loom_bin" ] && [ -x "$loom_bin" ] || { echo "loom: no loom command at $loom_bin: run make run in the clone, or set LOOM_BIN" >&2; exit 0; }
timeout "${LOOM_HOOK_TIMEOUT_S:-10}" "$loom_bin" "${args[@]}" >&2 \
  || echo "loom: ingest did not finish; will retry next time" >&2
exit 0
