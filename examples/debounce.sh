#!/usr/bin/env bash
#
# debounce.sh: fold a burst of change events into one job, from plain SQL
# (one statement per event, each its own transaction, so it works through
# PgBouncer in transaction mode).
#
#   ./debounce.sh QUEUE KEY PAYLOAD [psql connection options...]
#   ./debounce.sh reindex user:42 '{"user": 42, "seen": 17}' -h localhost -p 6432 -d app
#
# Each call enqueues a job for KEY due PGJQ_DEBOUNCE seconds from now (2).
# While that job still waits, the next call for the same KEY does not add a
# job: it replaces the waiting job's payload with its own and moves it
# PGJQ_DEBOUNCE seconds out again, but never later than PGJQ_DEBOUNCE_MAX
# seconds (10) after the first event of the burst, so a steady stream still
# gets handled.  Once a worker has claimed the job, the key is free
# (dedup_scope 'waiting'): an event during the run gets a new job, so no
# change goes unhandled.  Prints the job's id (the same one for a whole
# burst).
set -euo pipefail

if [ $# -lt 3 ]; then
	echo "usage: $0 QUEUE KEY PAYLOAD [psql connection options...]" >&2
	exit 2
fi
queue=$1
key=$2
payload=$3
shift 3
psqlc=(psql -X -q -At -v ON_ERROR_STOP=1 "$@")

# names, keys and payloads travel as psql variables (quoted by :'...'), never spliced
"${psqlc[@]}" -v queue="$queue" -v key="$key" -v payload="$payload" \
	-v delay="${PGJQ_DEBOUNCE:-2} seconds" -v max="${PGJQ_DEBOUNCE_MAX:-10} seconds" <<'SQL'
SELECT pgjq.enqueue(:'queue', :'payload'::jsonb, delay => :'delay'::interval,
                    dedup_key => :'key', dedup_scope => 'waiting',
                    on_duplicate => 'replace', debounce_max => :'max'::interval);
SQL
