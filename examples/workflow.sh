#!/usr/bin/env bash
#
# workflow.sh: a whole job graph enqueued atomically in one statement, then
# waited for from SQL: a fan-out of N parallel steps after a first step, and
# a final step after all of them (fan-in).  The workers are the ordinary
# ones (worker.py, worker.js, ...): a step becomes claimable when the jobs it
# names in `after` have completed, released by pgjq's background worker at
# their commit.  Two statements, each its own transaction, so it works
# through PgBouncer in transaction mode.
#
#   ./workflow.sh QUEUE N PAYLOAD [psql connection options...]
#   ./workflow.sh thumbnails 3 '{"sleep": 0.2}' -h localhost -p 6432 -d app
#
# Every step gets PAYLOAD.  Prints one line: final_id|state (state
# "completed" when the whole graph ran; "cancelled" if a step ended dead,
# which cancels the steps after it; "waiting" or "ready" if the wait ran out
# first).  Exit status 0 when the final step completed.  PGJQ_WAIT_FOR:
# seconds to wait for it in all (30), in waits of at most 2 s each, so that
# behind a small PgBouncer pool the waiting statement never keeps a server
# connection from the workers for long (README, "Pool size and waits").
set -euo pipefail

if [ $# -lt 3 ]; then
	echo "usage: $0 QUEUE N PAYLOAD [psql connection options...]" >&2
	exit 2
fi
queue=$1
n=$2
payload=$3
shift 3
wait_for=${PGJQ_WAIT_FOR:-30}
psqlc=(psql -X -q -At -v ON_ERROR_STOP=1 "$@")

# after[i] names earlier jobs of the same call as "#k" (k from 1): job 1 is
# the first step, 2..n+1 each wait for it, n+2 waits for all of them.
final=$("${psqlc[@]}" -v queue="$queue" -v payload="$payload" -v n="$n" <<'SQL'
SELECT max(id)
  FROM pgjq.enqueue_many(
         :'queue',
         array_fill(:'payload'::jsonb, ARRAY[:'n'::int + 2]),
         after => ARRAY['[]'::jsonb]
                  || array_fill('["#1"]'::jsonb, ARRAY[:'n'::int])
                  || (SELECT jsonb_agg('#' || k) FROM generate_series(2, :'n'::int + 1) k)) AS id;
SQL
)

deadline=$((SECONDS + wait_for))
while :; do
	line=$("${psqlc[@]}" -v id="$final" <<'SQL'
SELECT w.id || '|' || coalesce(j.state, 'unknown')
  FROM pgjq.wait_jobs(ARRAY[:'id']::bigint[], '2 s') w
  LEFT JOIN LATERAL pgjq.job(w.id) j ON true;
SQL
)
	# "unknown": job(id) had no row at that instant (a completion committing
	# just then); the next look, with a fresh snapshot, sees it finished
	case ${line#*|} in
		completed|cancelled|dead) break ;;
	esac
	[ $SECONDS -lt $deadline ] || break
done
echo "$line"
[ "${line#*|}" = completed ]
