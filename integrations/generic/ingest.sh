#!/usr/bin/env bash
# Loom's capture for any agent: ingest.sh TRANSCRIPT [THREAD_ID]
# Appends an exported transcript (Markdown "# user" / "# assistant" sections, a JSON
# array of {role, content}, or JSONL) to Loom with `loom ingest-transcript`. Run it again
# as the transcript grows: each turn has a stable id and is stored once.
# Environment: LOOM_URL, LOOM_TOKEN, LOOM_NAMESPACE (default "default"), LOOM_AGENT
# (default "agent"), LOOM_USER_ID, LOOM_BIN (default: loom on PATH).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: ingest.sh TRANSCRIPT [THREAD_ID]" >&2; exit 2; }
args=(ingest-transcript --namespace "${LOOM_NAMESPACE:-default}" --file "$1" --agent "${LOOM_AGENT:-agent}")
[ $# -ge 2 ] && args+=(--thread-id "$2")
[ -n "${LOOM_USER_ID:-}" ] && args+=(--user-id "$LOOM_USER_ID")
exec "${LOOM_BIN:-loom}" "${args[@]}"
