
# Copyright (c) pgjq contributors
#
# A streaming hot standby: committed enqueues are visible there (pgjq.job),
# writing calls fail as on any read-only server, and the pgjq worker stays
# idle without errors even when scheduled jobs are due and leases expired.
# After promotion the worker starts working: due jobs become ready and
# expired leases are rescued by themselves, and the new primary hands out and
# completes work.
#
# Limit counters: a claim on the standby must not build counters that stay
# in use after promotion.  Queue "lq" (concurrency 3) has 2 running jobs when
# the standby is asked for a claim; the primary then completes both and
# claims another, so 1 runs at promotion, and the promoted standby must hand
# out exactly 2 more.
#
# The primary serves database "postgres" only; database "jobs" (with the
# extension) is left unserved on the primary, so its due jobs and expired
# leases wait for the standby, which serves both.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# Two databases, maintenance on a standby, promotion under the worker
# (032_standby_ring.pl: the ring's state across promotion under load).
$primary->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
});
$primary->start;

$primary->safe_psql('postgres', 'CREATE DATABASE jobs');
for my $db ('postgres', 'jobs')
{
	$primary->safe_psql(
		$db, q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('q', lease => '1 second', backoff_base => '1 second', backoff_max => '1 second');
});
}

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->append_conf('postgresql.conf',
	"pgjq.database_names = 'postgres, jobs'\n");
$standby->start;
my $standby_start = -s $standby->logfile;

# --------------------------------------------------- work on the primary

ok( $primary->poll_query_until(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'",
		'1'),
	'the primary serves postgres');

# postgres: a delayed job the primary's worker promotes.
my $p_delayed = $primary->safe_psql('postgres',
	"SELECT pgjq.enqueue('q', '{\"k\": 1}', delay => '1 second')");
ok( $primary->poll_query_until(
		'postgres', "SELECT state FROM pgjq.job($p_delayed)", 'ready'),
	"the primary's worker promotes its delayed job");

# jobs: nobody serves it on the primary.  One job due in a second, one
# leased for a second and left to expire, one ready.
my $j_delayed = $primary->safe_psql('jobs',
	"SELECT pgjq.enqueue('q', '{\"k\": \"delayed\"}', delay => '1 second')");
my $j_leased = $primary->safe_psql('jobs',
	"SELECT pgjq.enqueue('q', '{\"k\": \"leased\"}')");
my ($leased_id, $leased_token) = split /\|/,
  $primary->safe_psql('jobs',
	"SELECT id, token FROM pgjq.claim('q', 1, lease => '1 second')");
is($leased_id, $j_leased, 'a job is leased on the primary');
my $j_ready = $primary->safe_psql('jobs',
	"SELECT pgjq.enqueue('q', '{\"k\": \"ready\"}')");

# jobs: a limited queue with 2 of its 10 jobs running.
my @lq_held = split /\n/,
  $primary->safe_psql(
	'jobs', q{
SELECT pgjq.create_queue('lq', concurrency => 3, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('lq', array_fill('{}'::jsonb, ARRAY[10]));
SELECT id || ',' || token FROM pgjq.claim('lq', 2) ORDER BY id;
});
shift @lq_held for 1 .. 2;    # the outputs of create_queue and enqueue_many
is(scalar(@lq_held), 2, 'limited queue lq: 2 jobs run on the primary');

$primary->wait_for_catchup($standby);

# ------------------------------------------------------- on the standby

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'the standby is in recovery');
is($standby->safe_psql('postgres', "SELECT state FROM pgjq.job($p_delayed)"),
	'ready', "the primary worker's promotion is visible on the standby");
is( $standby->safe_psql(
		'jobs',
		"SELECT string_agg(state, ',' ORDER BY id) FROM (SELECT (pgjq.job(x)).* FROM unnest(ARRAY[$j_delayed, $j_leased, $j_ready]::bigint[]) x) s"
	),
	'scheduled,running,ready',
	'committed enqueues and claims are visible on the standby');
is( $standby->safe_psql(
		'jobs', "SELECT ready || ',' || scheduled || ',' || running FROM pgjq.queue_stats WHERE queue = 'q'"),
	'1,1,1',
	'queue_stats works on the standby');

# Let the standby's worker see the due job and the expired lease for a while:
# several max_sleep periods after both deadlines have passed.
ok( $standby->poll_query_until(
		'jobs',
		"SELECT now() > run_at + interval '5 seconds' FROM pgjq.job($j_delayed)"),
	'the delayed job is long overdue on the standby');
is( $standby->safe_psql(
		'jobs',
		"SELECT string_agg(state, ',' ORDER BY id) FROM (SELECT (pgjq.job(x)).* FROM unnest(ARRAY[$j_delayed, $j_leased]::bigint[]) x) s"
	),
	'scheduled,running',
	'on the standby the overdue job and the expired lease are left alone');

my $log = slurp_file($standby->logfile, $standby_start);
note "standby log while in recovery:\n$log";
my @errors = grep { /\b(?:ERROR|FATAL|PANIC):/ && !/the database system is (?:starting up|not yet accepting connections)/ }
  split /\n/, $log;
is(scalar(@errors), 0, 'the standby logs no errors: the pgjq worker stays idle')
  or diag join("\n", @errors);
unlike($log, qr/read-only transaction/,
	'the pgjq worker attempts no writes on the standby');
unlike(
	$log,
	qr/background worker "[^"]*pgjq[^"]*" \(PID \d+\) (?:exited with exit code [1-9]|was terminated by signal)/,
	'no pgjq process exits abnormally on the standby');

# The API on a read-only server: reads work, writes fail as read-only.
for my $call (
	'pgjq.promote()', 'pgjq.rescue()',
	'pgjq.prune()', 'pgjq.maintain()',
	"pgjq.enqueue('q')", "pgjq.claim('q')",
	"pgjq.create_queue('q2')")
{
	my ($ret, $stdout, $stderr) =
	  $standby->psql('jobs', "SELECT $call", extra_params => ['-v', 'VERBOSITY=verbose']);
	isnt($ret, 0, "$call fails on the standby");
	like($stderr, qr/25006|read-only|recovery/,
		"$call fails as read-only on the standby");
}

# A claim of the limited queue on the standby (it fails read-only) while 2 of
# its jobs run; then the primary completes both and claims one more.
{
	my ($ret, $stdout, $stderr) = $standby->psql('jobs', "SELECT * FROM pgjq.claim('lq', 5)");
	isnt($ret, 0, 'a claim of the limited queue fails on the standby');
}
for my $h (@lq_held)
{
	my ($id, $token) = split /,/, $h;
	is($primary->safe_psql('jobs', "SELECT pgjq.complete($id, $token)"),
		't', "the primary completes lq job $id");
}
my $lq_running = $primary->safe_psql('jobs', "SELECT id || ',' || token FROM pgjq.claim('lq', 1)");
isnt($lq_running, '', 'the primary claims one more lq job');
$primary->wait_for_catchup($standby);

# ------------------------------------------------------------- promotion

$primary->stop;
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	'f', 'the standby is promoted');

for my $db ('postgres', 'jobs')
{
	ok( $standby->poll_query_until(
			'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = '$db'",
			'1'),
		"after promotion a pgjq worker serves $db");
}

ok( $standby->poll_query_until(
		'jobs', "SELECT state FROM pgjq.job($j_delayed)", 'ready'),
	'after promotion the overdue job becomes ready by itself');

# lq: 1 job runs, the limit is 3, so exactly 2 more are handed out.
is($standby->safe_psql('jobs', "SELECT count(*) FROM pgjq.claim('lq', 5)"),
	'2', 'after promotion the limited queue hands out exactly up to its limit');
is($standby->safe_psql('jobs', "SELECT count(*) FROM pgjq.claim('lq', 5)"),
	'0', '... and no more');
{
	my ($id, $token) = split /,/, $lq_running;
	is($standby->safe_psql('jobs', "SELECT pgjq.complete($id, $token)"),
		't', 'the job claimed on the old primary is completed');
	is($standby->safe_psql('jobs', "SELECT count(*) FROM pgjq.claim('lq', 5)"),
		'1', '... which frees exactly one slot');
}
ok( $standby->poll_query_until(
		'jobs',
		"SELECT state = 'ready' AND attempt = 1 AND last_error IS NOT NULL FROM pgjq.job($j_leased)"
	),
	'after promotion the expired lease is rescued by itself');
is($standby->safe_psql('jobs', "SELECT pgjq.complete($j_leased, $leased_token)"),
	'f', 'the token of the rescued lease is stale');

my @rows = split /\n/,
  $standby->safe_psql('jobs', "SELECT id, token FROM pgjq.claim('q', 10) ORDER BY id");
is( join(',', map { (split /\|/)[0] } @rows),
	"$j_delayed,$j_leased,$j_ready",
	'the promoted standby hands out its three jobs');
is($standby->safe_psql('jobs', "SELECT count(*) FROM pgjq.claim('q', 10)"),
	'0', 'nothing is handed out twice');
for my $row (@rows)
{
	my ($id, $token) = split /\|/, $row;
	is($standby->safe_psql('jobs', "SELECT pgjq.complete($id, $token)"),
		't', "the promoted standby completes job $id");
}
is( $standby->safe_psql(
		'jobs', "SELECT completed || ',' || ready || ',' || running FROM pgjq.queue_stats WHERE queue = 'q'"),
	'3,0,0',
	'the three jobs are completed');

my $new = $standby->safe_psql('jobs',
	"SELECT pgjq.enqueue('q', '{\"k\": \"new\"}', delay => '1 second')");
ok( $standby->poll_query_until('jobs', "SELECT state FROM pgjq.job($new)", 'ready'),
	'a job delayed on the promoted standby becomes ready by itself');
is( $standby->safe_psql(
		'jobs',
		"SELECT string_agg(pgjq.complete(id, token)::text, ',') FROM pgjq.claim('q', 10)"),
	'true',
	'the promoted standby claims and completes new work');
is($standby->safe_psql('jobs', "SELECT state FROM pgjq.job($new)"),
	'completed', 'the new job is completed');

$log = slurp_file($standby->logfile, $standby_start);
unlike(
	$log,
	qr/background worker "[^"]*pgjq[^"]*" \(PID \d+\) (?:exited with exit code [1-9]|was terminated by signal)/,
	'no pgjq process exited abnormally on the standby, before or after promotion');

verify_ok($standby, 'jobs', 'on the promoted standby, shared memory and the tables agree');

$standby->stop;
done_testing();
