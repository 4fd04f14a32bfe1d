#!/usr/bin/env bash
# A pgjq worker in bash with psql (Debian: postgresql-client).
#
# Usage:  worker.sh QUEUE [psql connection options...]
#         worker.sh emails -h localhost -p 6432 -d app
#
# Settings (environment variables):
#   PGJQ_BATCH   jobs claimed at a time (10)
#   PGJQ_LEASE   whole seconds a claim leases a job for; held jobs are heartbeaten every third
#                of it (30)
#   PGJQ_WAIT    seconds a claim waits in the server for a job (2: short, for PgBouncer; see
#                README, "Drivers and PgBouncer")
#   PGJQ_WORKER  the worker name pgjq.job() shows (psql-HOST-PID)
#
# The loop: claim a batch (waiting in the server when there is nothing to do), run each job,
# report a failure at once with fail() and the error text, complete the successes in one call.
# While a job runs (in the background), the loop extends the leases of the jobs it holds.  On
# SIGTERM or SIGINT it finishes the job it is running, reports, hands back the jobs it has not
# started (snooze, which spends no attempt) and exits.
#
# Every call is a new psql using the simple query protocol (no prepared statements), so it
# works through PgBouncer in any pool mode.  Values reach SQL only as psql variables quoted
# with :'name', never spliced into the statement text.
set -uo pipefail

queue=${1:?usage: worker.sh QUEUE [psql connection options...]}
shift
batch=${PGJQ_BATCH:-10}
lease=${PGJQ_LEASE:-30}
wait=${PGJQ_WAIT:-2}
name=${PGJQ_WORKER:-psql-$(hostname)-$$}
beat_every=$((lease / 3 > 0 ? lease / 3 : 1))
psql=(psql -X -q -t -A -F $'\t' -v ON_ERROR_STOP=1 "$@")

# ---------------------------------------------------------------------------------------------
# DEMO HANDLER: replace with your own.  Gets the payload (JSON text) as $1; exit 0 to succeed,
# anything else to fail the attempt (the last line it wrote to stderr becomes the job's
# last_error, and pgjq retries it with backoff).  It runs in a subshell, in the background.
# This one understands payloads like {"sleep": 1.5} and {"fail": "message"} (the regular
# expressions rely on jsonb's output layout: "key": value).
handle() {
	local payload=$1
	if [[ $payload =~ \"sleep\":\ ([0-9.]+) ]]; then
		sleep "${BASH_REMATCH[1]}"
	fi
	if [[ $payload =~ \"fail\":\ \"([^\"]*)\" ]]; then
		echo "${BASH_REMATCH[1]}" >&2
		return 1
	fi
}
# ---------------------------------------------------------------------------------------------

stopping=0
trap 'stopping=1' TERM INT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# sql STATEMENT [VAR=VALUE...]: runs one statement with psql variables set; prints its rows.
sql() {
	local statement=$1 vars=() kv
	shift
	for kv in "$@"; do vars+=(-v "$kv"); done
	"${psql[@]}" "${vars[@]}" <<<"$statement"
}

# {a,b,c}: a PostgreSQL array literal of the numbers given (ids and tokens only).
array() { local IFS=,; echo "{$*}"; }

echo "worker $name started"
while [ "$stopping" = 0 ]; do
	# One line per job: id, token, payload (jsonb text has no raw tab or newline).
	if ! jobs=$(sql "SELECT id, token, payload FROM pgjq.claim(:'q', batch => :'batch'::integer,
	                  lease => :'lease'::interval, worker => :'name', wait => :'wait'::interval)" \
		q="$queue" batch="$batch" lease="$lease s" name="$name" wait="$wait s"); then
		echo "claim failed, retrying"  # server or pooler gone: held jobs come back when their
		sleep 1                        # lease expires
		continue
	fi
	[ -z "$jobs" ] && continue
	ids=() tokens=() payloads=()
	while IFS=$'\t' read -r id token payload; do
		ids+=("$id") tokens+=("$token") payloads+=("$payload")
	done <<<"$jobs"
	echo "claimed ${#ids[@]}"
	done_ids=() done_tokens=()
	declare -A gone=()  # held jobs whose heartbeat said stale or cancelled
	for ((i = 0; i < ${#ids[@]}; i++)); do
		[ "$stopping" = 1 ] && break
		id=${ids[i]} token=${tokens[i]}
		[ -n "${gone[$id]:-}" ] && continue  # rescued or cancelled before we got to it
		(handle "${payloads[i]}") 2>"$tmp/err" &
		job=$!
		last_beat=$SECONDS
		while kill -0 "$job" 2>/dev/null; do
			sleep 0.1
			if ((SECONDS - last_beat >= beat_every)); then
				# Extend every held job not yet reported (this one and the ones after it).
				lost=$(sql "SELECT h.id FROM unnest(:'ids'::bigint[], :'tokens'::bigint[]) AS h(id, token)
				             WHERE pgjq.heartbeat(h.id, h.token, :'lease'::interval) IS NULL" \
					ids="$(array "${ids[@]:i}")" tokens="$(array "${tokens[@]:i}")" lease="$lease s") ||
					echo "heartbeat failed"
				for l in $lost; do
					gone[$l]=1
					echo "job $l lost"
				done
				last_beat=$SECONDS
			fi
		done
		wait "$job"
		rc=$?
		if ((rc > 128)) && [ "$stopping" = 1 ]; then
			# A signal interrupted wait itself: ask again for the job's own status.
			if wait "$job"; then rc=0; else
				r=$?
				[ "$r" != 127 ] && rc=$r
			fi
		fi
		if [ "$rc" = 0 ]; then
			done_ids+=("$id") done_tokens+=("$token")
		else
			error=$(tail -n 1 "$tmp/err")
			outcome=$(sql "SELECT pgjq.fail(:'id'::bigint, :'token'::bigint, :'error')" \
				id="$id" token="$token" error="${error:-handler failed}")
			echo "job $id $outcome: $error"
		fi
	done
	if [ ${#done_ids[@]} -gt 0 ]; then
		n=$(sql "SELECT pgjq.complete(:'ids'::bigint[], :'tokens'::bigint[])" \
			ids="$(array "${done_ids[@]}")" tokens="$(array "${done_tokens[@]}")")
		echo "completed $n of ${#done_ids[@]}"
	fi
	# Stopping: the jobs not started go back to the queue, no attempt spent.
	if ((i < ${#ids[@]})); then
		for ((j = i; j < ${#ids[@]}; j++)); do
			sql "SELECT pgjq.snooze(:'id'::bigint, :'token'::bigint, '0 s')" \
				id="${ids[j]}" token="${tokens[j]}" >/dev/null
		done
		echo "released $((${#ids[@]} - i))"
	fi
done
echo "worker $name stopped"
