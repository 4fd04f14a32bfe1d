#!/usr/bin/env bash
# A pgjq worker in bash: claim up to 10 jobs (sleeping in the server up to 10 s when there are
# none), "run" each, complete them all in one call.  Usage: worker.sh QUEUE [psql options...]
set -euo pipefail
queue=${1:?usage: worker.sh QUEUE [psql options]}
shift
psql=(psql -X -q -t -A -v ON_ERROR_STOP=1 "$@")

while true; do
	# one line per job: id|token|payload
	jobs=$("${psql[@]}" -v q="$queue" <<<"SELECT id || '|' || token || '|' || payload
		FROM pgjq.claim(:'q', batch => 10, wait => '10 s')")
	[ -z "$jobs" ] && continue
	ids=() tokens=()
	while IFS='|' read -r id token payload; do
		echo "running job $id: $payload"
		ids+=("$id") tokens+=("$token")
	done <<<"$jobs"
	"${psql[@]}" -c "SELECT pgjq.complete('{$(IFS=,; echo "${ids[*]}")}'::bigint[],
	                                      '{$(IFS=,; echo "${tokens[*]}")}'::bigint[])" >/dev/null
done
