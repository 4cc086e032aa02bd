#!/usr/bin/env bash
# Loom's capture for any agent: ingest.sh TRANSCRIPT [THREAD_ID]
# Appends an exported transcript (Markdown "# user" / "# assistant" sections, a JSON
# array of {role, content}, or JSONL) to Loom with `loom ingest-transcript`. Run it again
# as the transcript grows: each turn has a stable id and is stored once.
# Environment: LOOM_URL, LOOM_TOKEN, LOOM_NAMESPACE (default "default"), LOOM_AGENT
# (default "agent"), LOOM_USER_ID, LOOM_BIN (default: loom on PATH, else the clone's
# .venv/bin/loom).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: ingest.sh TRANSCRIPT [THREAD_ID]" >&2; exit 2; }
args=(ingest-transcript --namespace "${LOOM_NAMESPACE:-default}" --file "$1" --agent "${LOOM_AGENT:-agent}")
[ $# -ge 2 ] && args+=(--thread-id "$2")
[ -n "${LOOM_USER_ID:-}" ] && args+=(--user-id "$LOOM_USER_ID")
# The loom command: LOOM_BIN, else `loom` on PATH, else the .venv of the clone this script is in.
loom_bin=${LOOM_BIN:-$(command -v loom || echo "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/loom")}
[ -f "$loom_bin" ] && [ -x "$loom_bin" ] || { echo "loom: no loom command at $loom_bin: run make run in the clone, or set LOOM_BIN" >&2; exit 127; }
exec "$loom_bin" "${args[@]}"
