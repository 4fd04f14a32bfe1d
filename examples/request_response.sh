#!/usr/bin/env bash
#
# request_response.sh: request/response over a pgjq queue in two statements,
# each its own transaction (so it works through PgBouncer in transaction
# mode): enqueue the request, then wait in the server for the job to finish
# with pgjq.wait_jobs(), which a worker's commit wakes (no polling).
#
#   ./request_response.sh QUEUE PAYLOAD [psql connection options...]
#   ./request_response.sh emails '{"sleep": 0.5}' -h localhost -p 6432 -d app
#
# Prints one line: id|state|attempt|result (state "running" or "ready" if the
# wait ran out first, "unknown" if there is no such job).  Exit status 0 when
# the job completed, 1 otherwise.  PGJQ_WAIT_FOR: seconds to wait (10; the
# server caps a wait at pgjq.max_wait, 20 s by default).
set -euo pipefail

if [ $# -lt 2 ]; then
	echo "usage: $0 QUEUE PAYLOAD [psql connection options...]" >&2
	exit 2
fi
queue=$1
payload=$2
shift 2
wait_for=${PGJQ_WAIT_FOR:-10}
psqlc=(psql -X -q -At -v ON_ERROR_STOP=1 "$@")

# names and payloads travel as psql variables (quoted by :'...'), never spliced
id=$("${psqlc[@]}" -v queue="$queue" -v payload="$payload" <<'SQL'
SELECT pgjq.enqueue(:'queue', :'payload'::jsonb);
SQL
)

line=$("${psqlc[@]}" -v id="$id" -v wait="$wait_for seconds" <<'SQL'
SELECT id || '|' || coalesce(state, 'unknown') || '|' || coalesce(attempt::text, '')
       || '|' || coalesce(result::text, '')
  FROM pgjq.wait_jobs(ARRAY[:'id']::bigint[], :'wait'::interval);
SQL
)
echo "$line"
[ "$(echo "$line" | cut -d'|' -f2)" = completed ]
