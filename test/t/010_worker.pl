
# Copyright (c) pgjq contributors
#
# The background worker: one launcher plus one worker per database listed in
# pgjq.database_names.  Checks that it starts, promotes delayed jobs and
# rescues expired leases by itself (no manual promote/rescue), prunes expired
# history partitions, follows pgjq.database_names on SIGHUP, skips databases
# without the extension (and ones that do not exist) without crash-looping,
# and comes back after SIGTERM of the worker or of the launcher.
#
# Timing: every wait is a poll (at most 90 s, see timed_poll).  Where the
# contract promises promptness ("within a few seconds") the elapsed time is
# also asserted, against a bound far above what an idle machine needs.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

# pgjq.max_sleep and pgjq.prune_interval are short (2 s) so that the worker
# notices new databases and extensions quickly, except while promotion and
# rescue are timed: then max_sleep is raised to 60 s and prune_interval to an
# hour, well above the promptness bounds, so passing shows that the worker
# sleeps until the next deadline (a job's run_at, a lease's end) and is woken
# when one appears (a delayed job, a short lease, a retry), not that it
# merely polls often.
my $prompt = 15;    # seconds: "within a few seconds" on a loaded machine

my $node = PostgreSQL::Test::Cluster->new('worker');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '2s'
pgjq.prune_interval = '2s'
});
$node->start;

# --------------------------------------------------------------- helpers

sub workers_query
{
	my ($db) = @_;
	return
	  "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = '$db'";
}

sub worker_pid
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = '$db'"
	);
}

# The launcher's pid, found among the postmaster's children by process title,
# so that the launcher tests do not depend on pg_stat_activity showing it.
sub launcher_pid
{
	my ($pm) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
	for my $line (split /\n/, `ps -o pid=,args= --ppid $pm`)
	{
		return $1 if $line =~ /^\s*(\d+)\s.*pgjq launcher/;
	}
	return '';
}

# Poll (up to 90 s) until the launcher runs with a pid other than $old;
# returns the new pid or ''.
sub wait_new_launcher
{
	my ($old) = @_;
	for (1 .. 900)
	{
		my $pid = launcher_pid();
		return $pid if $pid ne '' && $pid ne $old;
		usleep(100_000);
	}
	return '';
}

# The server log without the statements the tests ran.
sub server_log
{
	my ($offset) = @_;
	return join '', grep { !/ statement: / }
	  split /^/m, slurp_file($node->logfile, $offset);
}

# Poll until $query returns $expected, for at most 90 s (everything polled
# here takes a few seconds at most; a shorter cap than poll_query_until's
# keeps a failing run within the test group's time budget); passes or fails
# test $what and returns the seconds it took.
my $poll_timeout = 90;

sub timed_poll
{
	my ($db, $query, $expected, $what) = @_;
	my $start = time;
	my ($ret, $out, $err);
	while (1)
	{
		($ret, $out, $err) = $node->psql($db, $query);
		last if $ret == 0 && $out eq $expected;
		last if time - $start > $poll_timeout;
		usleep(100_000);
	}
	my $took = time - $start;
	ok($ret == 0 && $out eq $expected, $what)
	  or diag "after ${poll_timeout} s, $query\nreturned '$out' (expected '$expected'), stderr: $err";
	note sprintf("%s: %.1f s", $what, $took);
	return $took;
}

sub job_state
{
	my ($db, $id) = @_;
	return $node->safe_psql($db, "SELECT state FROM pgjq.job($id)");
}

# In a queue of its own, enqueue a job due in one second; check in the same
# session that it cannot be claimed yet (unless the machine stalled past its
# run_at, when the check proves nothing and is skipped); return its id.
my $queues = 0;

sub enqueue_delayed
{
	my ($db) = @_;
	my $queue = 'delayed' . ++$queues;
	my $out = $node->safe_psql(
		$db, qq{
SELECT pgjq.create_queue('$queue') \\gset
SELECT pgjq.enqueue('$queue', '{"k": "delayed"}', delay => '1 second') AS id \\gset
SELECT :id, (SELECT count(*) FROM pgjq.claim('$queue')),
       (SELECT clock_timestamp() < run_at FROM pgjq.job(:id));
});
	my ($id, $claimed, $early) = split /\|/, $out;
  SKIP:
	{
		skip 'the machine stalled past the run_at', 1 unless $early eq 't';
		is($claimed, '0',
			"$db/$queue: a job due in 1 s cannot be claimed at once");
	}
	return $id;
}

my $worker_abnormal_exit =
  qr/background worker "pgjq worker[^"]*" \(PID \d+\) (?:exited with exit code [1-9]|was terminated by signal)/;

sub count_matches
{
	my ($text, $re) = @_;
	my $n = () = $text =~ /$re/g;
	return $n;
}

# ------------------------------------------------- the launcher and worker

my $launcher = wait_new_launcher('');
ok($launcher, 'the launcher runs');
my $seen = '0';
for (1 .. 100)    # it shows up right after it starts; allow 10 s
{
	$seen = $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq launcher' AND pid = $launcher"
	);
	last if $seen eq '1';
	usleep(100_000);
}
is($seen, '1',
	'pg_stat_activity shows the launcher with backend_type "pgjq launcher"');
is( $node->safe_psql(
		'postgres',
		"SELECT application_name FROM pg_stat_activity WHERE backend_type = 'pgjq launcher'"
	),
	'pgjq launcher',
	'the launcher reports application_name "pgjq launcher"');

$node->safe_psql('postgres', 'CREATE EXTENSION pgjq');
timed_poll('postgres', workers_query('postgres'),
	'1', 'a worker serves database postgres once the extension exists');
is( $node->safe_psql(
		'postgres',
		"SELECT application_name FROM pg_stat_activity WHERE backend_type = 'pgjq worker'"
	),
	'pgjq worker',
	'the worker reports application_name "pgjq worker"');

# ------------------------------------------- promotion of a delayed job

$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.max_sleep = '60s'");
$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.prune_interval = '1h'");
$node->reload;
sleep 3;    # the worker applies them at its next wake-up, at most 2 s away

$node->safe_psql('postgres', "SELECT pgjq.create_queue('w')");
my $far = $node->safe_psql('postgres',
	"SELECT pgjq.enqueue('w', '{\"k\": \"far\"}', delay => '1 hour')");

my $delayed = enqueue_delayed('postgres');
is(job_state('postgres', $delayed), 'scheduled', 'the delayed job is scheduled');
my $took = timed_poll('postgres',
	"SELECT state FROM pgjq.job($delayed)",
	'ready', 'the worker makes the delayed job ready by itself');
cmp_ok($took, '<', $prompt,
	"the delayed job is ready within $prompt s although max_sleep is 60 s"
);

my $claimed = $node->safe_psql('postgres',
	"SELECT id || ',' || token FROM pgjq.claim('delayed1', 10)");
my ($claimed_id, $claimed_token) = split /,/, $claimed;
is($claimed_id, $delayed, 'the promoted job is claimable (and the only one)');
is(job_state('postgres', $far),
	'scheduled', 'a job due in an hour stays scheduled');

# --------------------------------------------------- rescue of a lease

$node->safe_psql('postgres',
	"SELECT pgjq.create_queue('r', lease => '1 second', max_attempts => 2, backoff_base => '1 second', backoff_max => '1 second')"
);
my $rid = $node->safe_psql('postgres', "SELECT pgjq.enqueue('r', '{}')");

my ($id1, $token1, $attempt1) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT id, token, attempt FROM pgjq.claim('r', 1, lease => '1 second')");
is($id1, $rid, 'first claim hands out the job');
is($attempt1, '1', 'first claim is attempt 1');

# Expired, rescued (a failed attempt: back to scheduled with a backoff of
# about a second), then promoted again: all by the worker.
$took = timed_poll(
	'postgres',
	"SELECT state = 'ready' AND attempt = 1 AND last_error IS NOT NULL FROM pgjq.job($rid)",
	't',
	'an expired lease is rescued and the job becomes ready again by itself');
cmp_ok($took, '<', $prompt, "the rescue happens within $prompt s");
like(
	$node->safe_psql('postgres', "SELECT last_error FROM pgjq.job($rid)"),
	qr/lease/,
	'the rescued attempt records a lease error');

my ($id2, $token2, $attempt2) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT id, token, attempt FROM pgjq.claim('r', 1, lease => '1 second')");
is($id2, $rid, 'the rescued job is claimed again');
is($attempt2, '2', 'the second claim is attempt 2');
isnt($token2, $token1, 'the second claim has a new token');
is( $node->safe_psql('postgres',
		"SELECT pgjq.complete($rid, $token1)::text || ',' || (pgjq.heartbeat($rid, $token1) IS NULL)::text"
	),
	'false,true',
	'the first, rescued token is stale for complete and heartbeat');

timed_poll(
	'postgres',
	"SELECT state FROM pgjq.job($rid)",
	'dead', 'after max_attempts expired leases the job is dead');
is($node->safe_psql('postgres', "SELECT attempt FROM pgjq.job($rid)"),
	'2', 'the dead job counted two attempts');
is($node->safe_psql('postgres', "SELECT pgjq.complete($rid, $token2)"),
	'f', 'the last token is stale once the job is dead');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('r', 10)"),
	'0', 'a dead job is not handed out');

# ------------------------------------------------------------------ prune

$node->safe_psql('postgres', 'ALTER SYSTEM RESET pgjq.max_sleep');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET pgjq.prune_interval');
$node->reload;

# Finished history lives in hourly partitions by finish time (dead jobs in
# pgjq.job_history_YYYYMMDD_HH, UTC, listed in pgjq.history_partition);
# prune() truncates and drops one once its end plus the longest retention of
# the queues with rows in it has passed.  A real partition needs at least an
# hour to expire, so this part is white-box: make the partition of a past
# hour as the storage layer does, move the dead job into it (exactly what its
# history looks like once that much time has passed), and let the worker
# remove it.  It skips, saying so, when the storage layout has changed.
is($node->safe_psql('postgres', "SELECT pgjq.complete($claimed_id, $claimed_token)"),
	't', 'the promoted job completes');
is(job_state('postgres', $claimed_id), 'completed', 'its history is visible');
SKIP:
{
	my $layout = $node->safe_psql(
		'postgres', q{
SELECT (SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = to_regclass('pgjq.history_partition') AND attnum > 0 AND NOT attisdropped)
       || ';' || pg_get_partkeydef(to_regclass('pgjq.job_history'))});
	skip "the history storage has changed ($layout): update this white-box test", 5
	  unless $layout eq 'relname,parent,lower_bound,upper_bound,queue_ids;RANGE (finished_at)';
	$node->safe_psql(
		'postgres', q{
CREATE TABLE pgjq.job_history_20000101_00
  (LIKE pgjq.job_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE pgjq.job_history ATTACH PARTITION pgjq.job_history_20000101_00
  FOR VALUES FROM ('2000-01-01 00:00:00+00') TO ('2000-01-01 01:00:00+00');
INSERT INTO pgjq.history_partition (relname, parent, lower_bound, upper_bound)
  VALUES ('job_history_20000101_00', 'job_history', '2000-01-01 00:00:00+00', '2000-01-01 01:00:00+00');
});
	$node->safe_psql('postgres',
		"UPDATE pgjq.job_history SET finished_at = '2000-01-01 00:30:00+00' WHERE id = $rid"
	);
	is( $node->safe_psql(
			'postgres', "SELECT count(*) FROM pgjq.job_history_20000101_00"),
		'1',
		'the dead job now sits in the partition of a long-past hour');

	timed_poll('postgres',
		"SELECT to_regclass('pgjq.job_history_20000101_00') IS NULL",
		't', 'the worker drops the expired history partition by itself');
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM pgjq.history_partition WHERE relname = 'job_history_20000101_00'"
		),
		'0',
		'the dropped partition is no longer listed');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.job($rid)"),
		'0', 'the pruned job is gone');
	is($node->safe_psql('postgres', "SELECT state FROM pgjq.job($claimed_id)"),
		'completed', 'history that has not expired is kept');
}

# A queue with no retention: its finished jobs expire at once, but their
# partition's hour has not passed yet; prune() is callable by hand and
# returns a count.
$node->safe_psql('postgres', "SELECT pgjq.create_queue('r0', retention => '0')");
$node->safe_psql(
	'postgres', q{
SELECT pgjq.enqueue('r0');
SELECT pgjq.complete(id, token) FROM pgjq.claim('r0');
});
like($node->safe_psql('postgres', 'SELECT pgjq.prune()'),
	qr/^\d+$/, 'pgjq.prune() is callable by hand and returns a count');
is($node->safe_psql('postgres', workers_query('postgres')),
	'1', 'the worker is alive after pruning');

# ------------------------------------------ job_done's index is summarized
#
# job(id) finds a completed job through the BRIN index of its job_done
# partition, which sees only summarized ranges: a range that is not is read
# in full by every lookup (it was every page of the hour's partition, 32 ms
# a lookup at 500,000 rows).  The worker summarizes the filled ranges on
# every pass and leaves the filling one (summarizing it would make each new
# row update the summary).  White-box: ten ranges' worth of completions go
# straight into this hour's partition (in one hour, so the check below holds
# unless the hour ends meanwhile: then the next prune summarizes all of it).
{
	my $part = $node->safe_psql('postgres', q{
SELECT relname FROM pgjq.history_partition
 WHERE parent = 'job_done' AND lower_bound <= now() AND upper_bound > now()});
	like($part, qr/^job_done_\d{8}_\d\d$/, "this hour's job_done partition exists");
	$node->safe_psql('postgres', "SELECT pgjq.create_queue('brin')");
	# autovacuum summarizes too, when it comes: here it must not
	$node->safe_psql('postgres', "ALTER TABLE pgjq.$part SET (autovacuum_enabled = off)");
	$node->safe_psql('postgres', qq{
INSERT INTO pgjq.$part (queue_id, finished_at, min_id, max_id, ids, attempts, enqueued_at)
SELECT (SELECT queue_id FROM pgjq.queue WHERE name = 'brin'), now(),
	   10000000 + g * 10, 10000000 + g * 10 + 9,
	   array(SELECT 10000000 + g * 10 + k FROM generate_series(0, 9) k),
	   array_fill(1, array[10]), array_fill(now(), array[10])
  FROM generate_series(1, 8000) g;
-- verify() holds every id to have been handed out by the sequence
SELECT setval('pgjq.job_id_seq', greatest(10080010, (SELECT last_value FROM pgjq.job_id_seq)));});
	my $pages = $node->safe_psql('postgres', "SELECT pg_relation_size('pgjq.$part') / 8192");
	cmp_ok($pages, '>=', 320, "the partition has at least ten ranges of 32 pages ($pages pages)");
	my $lossy;
	my $t0 = time;
	while (time - $t0 < 90)
	{
		# without statistics the planner may take a seq scan: the index's
		# scan is what job() runs and what the count below is about
		my $plan = $node->safe_psql('postgres', qq{
SET enable_seqscan = off;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)
SELECT * FROM pgjq.$part WHERE min_id <= 10000015 AND max_id >= 10000015});
		($lossy) = $plan =~ /lossy=(\d+)/;
		$lossy //= $pages;
		last if $lossy < 64;
		sleep 1;
	}
	cmp_ok($lossy, '<', 64,
		"the worker summarized the filled ranges: a lookup reads $lossy of $pages pages");
	is($node->safe_psql('postgres', 'SELECT state FROM pgjq.job(10000015)'),
		'completed', 'job() finds the job through the summarized index');
	my $still_part = $node->safe_psql('postgres', q{
SELECT relname FROM pgjq.history_partition
 WHERE parent = 'job_done' AND lower_bound <= now() AND upper_bound > now()});
  SKIP:
	{
		my $now_pages = $node->safe_psql('postgres', "SELECT pg_relation_size('pgjq.$part') / 8192");
		skip 'the hour ended during the test, or no range is filling', 1
		  if $still_part ne $part || $now_pages % 32 == 0;
		my $last = int($now_pages / 32) * 32;
		is($node->safe_psql('postgres',
				"SELECT brin_summarize_range('pgjq.${part}_id_idx', $last)"),
			'1', 'the range still filling was left unsummarized');
	}
}

my ($offset, $log);

# ------------------------------------ wake-ups for short leases and retries

# prune_interval is long here, so nothing but a deadline or a commit wakes
# the worker (max_sleep is 60 s): a rescue or promotion within $on_time s of
# its due time shows the worker was woken for it.  The lateness measured
# (due time to the poll that saw the change, poll interval included) is
# reported.
my $on_time = 2;
$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.max_sleep = '60s'");
$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.prune_interval = '1h'");
$node->reload;
sleep 3;    # the worker applies them at its next wake-up, 2 s away at most

# Poll every 50 ms until $query returns "t|<seconds late>"; returns the
# seconds late, or 999 after 90 s.
sub lateness
{
	my ($query) = @_;
	my $start = time;
	while (time - $start < 90)
	{
		my ($done, $late) = split /\|/, $node->safe_psql('postgres', $query);
		return $late if $done eq 't';
		usleep(50_000);
	}
	return 999;
}

$node->safe_psql('postgres',
	"SELECT pgjq.create_queue('soon', backoff_base => '1 hour', backoff_max => '1 hour')");
$node->safe_psql('postgres', "SELECT pgjq.enqueue('soon')");
my ($sl_id, $sl_until) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT id, lease_until FROM pgjq.claim('soon', 1, lease => '1 second')");
my $late = lateness(
	"SELECT state = 'scheduled', extract(epoch FROM clock_timestamp() - '$sl_until'::timestamptz)
	   FROM pgjq.job($sl_id)");
diag "a 1 s lease was rescued $late s after it ended";
cmp_ok($late, '<', $on_time,
	"a 1 s lease is rescued within $on_time s of its end although max_sleep is 60 s");

for my $retry_in ('0', '1 second')
{
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('soon')");
	my ($fid, $ftok) = split /\|/,
	  $node->safe_psql('postgres', "SELECT id, token FROM pgjq.claim('soon')");
	is( $node->safe_psql('postgres',
			"SELECT pgjq.fail($fid, $ftok, 'boom', retry_in => '$retry_in')"),
		'retry',
		"fail(retry_in => '$retry_in') schedules a retry");
	$late = lateness(
		"SELECT state = 'ready', extract(epoch FROM clock_timestamp() - run_at) FROM pgjq.job($fid)"
	);
	diag "a retry in '$retry_in' was promoted $late s after it was due";
	cmp_ok($late, '<', $on_time,
		"a retry in '$retry_in' is promoted within $on_time s of its due time");
}

# --------------------------------- a worker backlog commits chunk by chunk

# 2500 jobs fall due at the same instant and 2500 leases end at the same
# instant: the worker handles them in chunks of 1000, each in its own
# transaction, so claimers see the first ones at once and no transaction
# locks the whole backlog.  Each chunk's rows carry its transaction id, the
# one thing read from the tables directly: a promoted job is a new body in
# the ring, a rescued one a scheduled row of pgjq.job.
$node->safe_psql('postgres', "SELECT pgjq.create_queue('bulk')");
$node->safe_psql('postgres',
	"SELECT pgjq.create_queue('bulkr', backoff_base => '1 hour', backoff_max => '1 hour')");
$node->safe_psql(
	'postgres', q{
SELECT count(pgjq.enqueue('bulk', run_at => now() + interval '3 seconds')) FROM generate_series(1, 2500);
SELECT count(pgjq.enqueue('bulkr')) FROM generate_series(1, 2500);
SELECT count(*) FROM pgjq.claim('bulkr', 2500, lease => '3 seconds');
});
timed_poll('postgres',
	"SELECT ready FROM pgjq.queue_stats WHERE queue = 'bulk'",
	'2500', 'the worker promotes a backlog of 2500 jobs due at once');
cmp_ok(
	$node->safe_psql('postgres',
		"SELECT count(DISTINCT j.xmin::text) FROM (SELECT xmin, queue_id FROM pgjq.job"
		  . " UNION ALL SELECT xmin, queue_id FROM pgjq.ring_body_0 UNION ALL SELECT xmin, queue_id FROM pgjq.ring_body_1"
		  . " UNION ALL SELECT xmin, queue_id FROM pgjq.ring_body_2 UNION ALL SELECT xmin, queue_id FROM pgjq.ring_body_3) j"
		  . " JOIN pgjq.queue q USING (queue_id) WHERE q.name = 'bulk'"),
	'>=', 3, 'the promoted backlog was committed in chunks');
timed_poll('postgres',
	"SELECT scheduled FROM pgjq.queue_stats WHERE queue = 'bulkr'",
	'2500', 'the worker rescues 2500 leases that end at once');
cmp_ok(
	$node->safe_psql('postgres',
		"SELECT count(DISTINCT j.xmin::text) FROM pgjq.job j JOIN pgjq.queue q USING (queue_id) WHERE q.name = 'bulkr'"),
	'>=', 3, 'the rescued backlog was committed in chunks');
$node->safe_psql('postgres',
	"SELECT pgjq.drop_queue('bulk', force => true), pgjq.drop_queue('bulkr', force => true)");

# --------------------------- a failing step and a busy history parent

# A client holds SHARE UPDATE EXCLUSIVE on job_history (as a partition
# creation or a manual VACUUM would) after the next hour's partitions were
# removed, and ACCESS EXCLUSIVE on history_partition.  The worker's prune
# cannot create the partitions (it skips that rather than wait) and waits for
# history_partition.  SIGTERM must stop it there, cleanly.  With lock_timeout
# set, the prune fails instead, an error the worker reports and survives;
# meanwhile promotion and rescue go on on time.
$node->safe_psql('postgres', q{
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT relname FROM pgjq.history_partition WHERE lower_bound > now() LOOP
    EXECUTE format('DROP TABLE pgjq.%I', r.relname);
  END LOOP;
  DELETE FROM pgjq.history_partition WHERE lower_bound > now();
END $$});
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN');
$locker->query_safe('LOCK pgjq.job_history IN SHARE UPDATE EXCLUSIVE MODE');
$locker->query_safe('LOCK pgjq.history_partition IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.prune_interval = '1s'");
$node->reload;

# a new worker prunes on its first pass (whatever the old one planned)
my $wpid = worker_pid('postgres');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($wpid)");
timed_poll('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres' AND pid <> $wpid",
	'1', 'a new worker starts');
$wpid = worker_pid('postgres');
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $wpid"),
	'the pruning worker waits for a lock on the history tables');
$offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($wpid)");
my $t0 = time;
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $wpid"),
	'the terminated worker leaves');
my $gone = time - $t0;
diag sprintf('the worker left %.1f s after SIGTERM while waiting for a lock', $gone);
cmp_ok($gone, '<', 5, 'SIGTERM stops a worker that waits in a step within 5 s');

$node->safe_psql('postgres', "ALTER SYSTEM SET lock_timeout = '200ms'");
$node->reload;
timed_poll('postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres' AND pid <> $wpid",
	'1', 'a new worker starts');
$log = server_log($offset);
unlike($log, qr/\(PID $wpid\) exited with exit code [1-9]/,
	'the terminated worker exited cleanly');
$wpid = worker_pid('postgres');
$offset = -s $node->logfile;
sleep 3;    # a few failed prunes
my $dl = enqueue_delayed('postgres');
$late = lateness("SELECT state = 'ready', extract(epoch FROM clock_timestamp() - run_at) FROM pgjq.job($dl)");
diag "promoted $late s late while prune fails";
cmp_ok($late, '<', $on_time, 'while prune fails, a delayed job is promoted on time');
$node->safe_psql('postgres', "SELECT pgjq.enqueue('soon')");
($sl_id, $sl_until) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT id, lease_until FROM pgjq.claim('soon', 1, lease => '1 second')");
$late = lateness(
	"SELECT state = 'scheduled', extract(epoch FROM clock_timestamp() - '$sl_until'::timestamptz)
	   FROM pgjq.job($sl_id)");
diag "rescued $late s late while prune fails";
cmp_ok($late, '<', $on_time, 'while prune fails, an expired lease is rescued on time');
$log = server_log($offset);
like($log, qr/ERROR:  canceling statement due to lock timeout/,
	'the failing prune step is reported');
is(worker_pid('postgres'), $wpid, 'the worker survives the failing step');
is(count_matches($log, $worker_abnormal_exit), 0, 'no worker exits abnormally');

$node->safe_psql('postgres', 'ALTER SYSTEM RESET lock_timeout');
$node->reload;
$locker->query_safe('COMMIT');
$locker->quit;
timed_poll('postgres', "SELECT count(*) FROM pgjq.history_partition WHERE lower_bound > now()",
	'2', "the worker creates the next hour's partitions once the lock is free");

# ------------------------------------ prune does not block completions

# Six expired partitions of job_done, ten days old; a client holds the row of
# the third in history_partition locked, so the worker's prune stops there.
# It must have committed the first two (one partition per transaction) and
# hold no lock on the parent meanwhile: a completion goes through at once.
$node->safe_psql('postgres', "SELECT pgjq.create_queue('pq', retention => '3650 days')");
$node->safe_psql(
	'postgres', q{
DO $$
DECLARE lo timestamptz; part text; qid int;
BEGIN
  SELECT q.queue_id INTO qid FROM pgjq.queue q WHERE q.name = 'pq';
  FOR k IN 0..5 LOOP
    lo := date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '10 days' + k * interval '1 hour';
    part := 'job_done_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24');
    EXECUTE format('CREATE TABLE pgjq.%I (LIKE pgjq.job_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
    EXECUTE format('ALTER TABLE pgjq.job_done ATTACH PARTITION pgjq.%I FOR VALUES FROM (%L) TO (%L)',
                   part, lo, lo + interval '1 hour');
    INSERT INTO pgjq.history_partition (relname, parent, lower_bound, upper_bound, queue_ids)
      VALUES (part, 'job_done', lo, lo + interval '1 hour', ARRAY[qid]);
  END LOOP;
END $$});
my @parts = split /\n/, $node->safe_psql('postgres',
	"SELECT relname FROM pgjq.history_partition WHERE lower_bound < now() - interval '9 days' ORDER BY lower_bound");
is(scalar(@parts), 6, 'six old partitions are listed');
my $rowlock = $node->background_psql('postgres');
$rowlock->query_safe('BEGIN');
$rowlock->query_safe(
	"SELECT 1 FROM pgjq.history_partition WHERE relname = '$parts[2]' FOR UPDATE");
$node->safe_psql('postgres', "SELECT pgjq.alter_queue('pq', retention => '1 day')");

ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'"),
	'the prune waits at the third partition');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_class WHERE relname IN ('$parts[0]', '$parts[1]')"),
	'0', 'the partitions before it are already dropped and committed');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		  WHERE a.backend_type = 'pgjq worker' AND l.relation = 'pgjq.job_done'::regclass"),
	'0', 'the waiting prune holds no lock on the parent job_done');
$node->safe_psql('postgres', "SELECT pgjq.enqueue('pq')");
$t0 = time;
my ($crc, $cout, $cerr) = $node->psql('postgres',
	"SET statement_timeout = '20s'; SELECT pgjq.complete(id, token) FROM pgjq.claim('pq')");
my $ctook = time - $t0;
diag sprintf('a completion during the prune took %.2f s', $ctook);
is($cout, 't', 'a completion during the prune succeeds') or diag $cerr;
cmp_ok($ctook, '<', 3, 'a completion during the prune is not blocked by it');
$rowlock->query_safe('ROLLBACK');
$rowlock->quit;
timed_poll('postgres',
	"SELECT count(*) FROM pgjq.history_partition WHERE lower_bound < now() - interval '9 days'",
	'0', 'then the prune removes the rest');
$node->safe_psql('postgres', "ALTER SYSTEM RESET pgjq.max_sleep");
$node->safe_psql('postgres', "ALTER SYSTEM RESET pgjq.prune_interval");
$node->reload;

# ------------------------------------------- SIGHUP: a second database

$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->safe_psql('db2', 'CREATE EXTENSION pgjq');
my $d2 = enqueue_delayed('db2');
sleep 3;    # a negative check: nobody serves db2 yet
is(job_state('db2', $d2), 'scheduled',
	'db2 is not served before it is listed');
is($node->safe_psql('postgres', workers_query('db2')),
	'0', 'no worker for db2 before it is listed');

$node->safe_psql('postgres',
	"ALTER SYSTEM SET pgjq.database_names = 'postgres, db2'");
$node->reload;
timed_poll('postgres', workers_query('db2'),
	'1', 'after SIGHUP a worker serves the newly listed db2');
timed_poll('db2', "SELECT state FROM pgjq.job($d2)",
	'ready', "db2's delayed job is made ready by its worker");
is($node->safe_psql('postgres', workers_query('postgres')),
	'1', 'postgres is still served by one worker');

$node->safe_psql('postgres',
	"ALTER SYSTEM SET pgjq.database_names = 'postgres'");
$node->reload;
timed_poll('postgres', workers_query('db2'),
	'0', 'after SIGHUP the worker of the unlisted db2 goes away');
is($node->safe_psql('postgres', workers_query('postgres')),
	'1', 'postgres is still served');
my $d2b = enqueue_delayed('db2');
sleep 3;    # a negative check
is(job_state('db2', $d2b), 'scheduled', 'db2 is no longer served');
$node->safe_psql('postgres', 'DROP DATABASE db2');
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE datname = 'db2'"),
	'0', 'an unlisted database can be dropped');

# The postgres worker keeps working after the reloads.
my $d1 = enqueue_delayed('postgres');
timed_poll('postgres', "SELECT state FROM pgjq.job($d1)",
	'ready', 'postgres is still promoted after the reloads');

# ------------------- databases without the extension, or that do not exist


# The pids of the workers the log says were started for $db, and how many of
# them exited abnormally.
sub worker_starts
{
	my ($log, $db) = @_;
	my @pids = $log =~ /\[(\d+)\] LOG:  pgjq worker started for database "$db"/g;
	my $bad = 0;
	for my $pid (@pids)
	{
		$bad++
		  if $log =~ /\(PID $pid\) (?:exited with exit code [1-9]|was terminated by signal)/;
	}
	return (scalar(@pids), $bad);
}

$node->safe_psql('postgres', 'CREATE DATABASE noext');
$offset = -s $node->logfile;
$node->safe_psql('postgres',
	"ALTER SYSTEM SET pgjq.database_names = 'postgres, noext'");
$node->reload;
sleep 10;    # five max_sleep periods: long enough to see a crash-loop
$log = server_log($offset);
note "log while noext is listed without the extension:\n$log";
my ($starts, $bad) = worker_starts($log, 'noext');
cmp_ok($starts, '<=', 2,
	'a listed database without the extension does not make its worker loop');
is($bad, 0, 'no worker for a database without the extension exits abnormally');
unlike($log, qr/ERROR|FATAL/, 'a database without the extension logs no errors');
is($node->safe_psql('postgres', workers_query('postgres')),
	'1', 'postgres is still served while noext lacks the extension');

$node->safe_psql('noext', 'CREATE EXTENSION pgjq');
my $dn = enqueue_delayed('noext');
timed_poll('noext', "SELECT state FROM pgjq.job($dn)",
	'ready', 'once the extension is created, its database is served');

# The extension dropped and created again under a running worker.
$offset = -s $node->logfile;
$node->safe_psql('noext', 'DROP EXTENSION pgjq');
sleep 5;    # a negative check: a few worker passes (max_sleep is 2 s)
$log = server_log($offset);
note "log after DROP EXTENSION:\n$log";
is(count_matches($log, $worker_abnormal_exit),
	0, 'DROP EXTENSION does not make the worker fail');
$node->safe_psql('noext', 'CREATE EXTENSION pgjq');
my $dn2 = enqueue_delayed('noext');
timed_poll('noext', "SELECT state FROM pgjq.job($dn2)",
	'ready', 'after DROP and CREATE EXTENSION the database is served again');

# A database that does not exist cannot be served: the launcher looks it up
# in pg_database before starting a worker, says so once in the log, and
# starts none (a worker would only fail to connect, every 5 s).  It must not
# disturb the others.
$offset = -s $node->logfile;
$node->safe_psql('postgres',
	"ALTER SYSTEM SET pgjq.database_names = 'postgres, nosuchdb'");
$node->reload;
sleep 10;    # two restart delays, five max_sleep periods
$log = server_log($offset);
note "log while nosuchdb is listed:\n$log";
is(count_matches($log, qr/FATAL:  database "nosuchdb" does not exist/),
	0, 'no worker is started for a listed database that does not exist');
is( count_matches(
		$log, qr/database "nosuchdb" listed in pgjq.database_names does not exist/),
	1,
	'the launcher says once that a listed database does not exist');
timed_poll('postgres', workers_query('noext'),
	'0', 'the worker of the unlisted noext goes away');
my $d3 = enqueue_delayed('postgres');
timed_poll('postgres', "SELECT state FROM pgjq.job($d3)",
	'ready', 'postgres is still served while nosuchdb is listed');

$node->safe_psql('postgres',
	"ALTER SYSTEM SET pgjq.database_names = 'postgres'");
$node->reload;

# ---------------------------------------------------- SIGTERM and restart

my $old_worker = worker_pid('postgres');
ok($old_worker, 'a worker serves postgres before SIGTERM');
$offset = -s $node->logfile;
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($old_worker)"),
	't', 'SIGTERM sent to the worker');
$took = timed_poll(
	'postgres',
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres' AND pid <> $old_worker",
	'1',
	'a new worker replaces the terminated one');
cmp_ok($took, '<', 30, 'the worker is back within 30 s');
$log = server_log($offset);
note "log after SIGTERM of the worker:\n$log";
unlike($log, qr/terminating any other active server processes/,
	'SIGTERM of the worker does not cause a crash restart');
my $d4 = enqueue_delayed('postgres');
timed_poll('postgres', "SELECT state FROM pgjq.job($d4)",
	'ready', 'the new worker promotes delayed jobs');

my $old_launcher = launcher_pid();
ok($old_launcher, 'a launcher runs before SIGTERM');
$offset = -s $node->logfile;
kill 'TERM', $old_launcher;
my $start = time;
my $new_launcher = wait_new_launcher($old_launcher);
ok($new_launcher, 'a new launcher replaces the terminated one');
note sprintf('launcher restarted %.1f s after SIGTERM', time - $start);
timed_poll('postgres', workers_query('postgres'),
	'1', 'after the launcher restart postgres is served by one worker');
sleep 3;    # a negative check: no second worker appears for postgres
is($node->safe_psql('postgres', workers_query('postgres')),
	'1', 'after the launcher restart there is still exactly one worker for postgres');
sleep 12;    # a negative check: past two restart delays of the new launcher
$log = server_log($offset);
note "log after SIGTERM of the launcher:\n$log";
unlike($log, qr/terminating any other active server processes/,
	'SIGTERM of the launcher does not cause a crash restart');
is(count_matches($log, $worker_abnormal_exit),
	0, 'after the launcher restart no pgjq worker exits abnormally');

# The new launcher manages the worker it found: unlisting the database
# stops it, listing it again starts one.
$node->safe_psql('postgres', "ALTER SYSTEM SET pgjq.database_names = ''");
$node->reload;
timed_poll('postgres', workers_query('postgres'),
	'0', 'after the launcher restart, unlisting postgres stops its worker');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET pgjq.database_names');
$node->reload;
timed_poll('postgres', workers_query('postgres'),
	'1', 'listing postgres again starts a worker');
my $d5 = enqueue_delayed('postgres');
timed_poll('postgres', "SELECT state FROM pgjq.job($d5)",
	'ready', 'delayed jobs are promoted after the launcher restart');

# ------------------------------------------------------------ at the end

$log = server_log(0);
unlike(
	$log,
	qr/terminating any other active server processes|was terminated by signal/,
	'no server process crashed during the test');
is($node->safe_psql('postgres', "SELECT state FROM pgjq.job($far)"),
	'scheduled', 'the far job is still scheduled');

verify_ok($node, 'postgres', 'at the end, shared memory and the tables agree');

$node->stop;
done_testing();
