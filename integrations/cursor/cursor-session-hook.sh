#!/usr/bin/env bash
# Loom's capture for Cursor: run by Cursor's after-conversation hook (the "stop" hook in
# .cursor/hooks.json). Reads the hook's JSON on stdin and hands the conversation's
# transcript to `loom ingest-transcript` (thread cursor/<conversation_id>, agent cursor).
# A transcript is Markdown with "# user" / "# assistant" sections, a JSON array of
# {role, content} or JSONL (what ingest-transcript reads); its turns get stable ids, so
# running this after every reply sends each turn once.
#
# Never blocks Cursor: bounded by LOOM_HOOK_TIMEOUT_S (default 10), failures go to
# stderr, the hook always answers {} and exits 0; what failed is sent next time.
# Environment: LOOM_URL, LOOM_TOKEN, LOOM_NAMESPACE (default "default"), LOOM_USER_ID,
# LOOM_CAPTURE_CONVERSATIONS=false (off), LOOM_BIN (default: loom on PATH, else the
# clone's .venv/bin/loom).
set -u
input=$(cat)
echo '{}'
[ "${LOOM_CAPTURE_CONVERSATIONS:-true}" = "false" ] && exit 0
[ -n "${LOOM_TOKEN:-}" ] || { echo "loom: LOOM_TOKEN is not set; nothing captured" >&2; exit 0; }

field() {  # the hook JSON's string field $1 (python3 is on every machine Loom runs on)
  printf '%s' "$input" | python3 -c 'import json, sys; v = json.load(sys.stdin).get(sys.argv[1]); print(v if isinstance(v, str) else "")' "$1" 2>/dev/null
}
transcript=$(field transcript_path)
conversation=$(field conversation_id)
[ -n "$transcript" ] && [ -f "$transcript" ] || { echo "loom: no transcript_path in the hook input" >&2; exit 0; }
[ -n "$conversation" ] || conversation=$(basename "$transcript")

args=(ingest-transcript --namespace "${LOOM_NAMESPACE:-default}" --file "$transcript"
      --thread-id "cursor/$conversation" --agent cursor)
[ -n "${LOOM_USER_ID:-}" ] && args+=(--user-id "$LOOM_USER_ID")
# The loom command: LOOM_BIN, else `loom` on PATH, else the .venv of the clone this script is in.
loom_bin=${LOOM_BIN:-$(command -v loom || echo "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/loom")}
[ -f "$loom_bin" ] && [ -x "$loom_bin" ] || { echo "loom: no loom command at $loom_bin: run make run in the clone, or set LOOM_BIN" >&2; exit 0; }
timeout "${LOOM_HOOK_TIMEOUT_S:-10}" "$loom_bin" "${args[@]}" >&2 \
  || echo "loom: ingest did not finish; will retry next time" >&2
exit 0
