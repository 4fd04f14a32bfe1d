
# Copyright (c) pgjq contributors
#
# Crashes lose nothing and bring nothing back.  Producers and workers run
# (pgbench, in the background) while we kill -9, in turn, a client backend,
# the pgjq worker and the postmaster.  After each restart the load resumes;
# then the postmaster is killed 19 more times under load; at the end the
# queue is drained and checked:
#
# - every committed enqueue exists (producers record each returned id in the
#   table "produced" in the same statement, so only committed enqueues count)
#   and is completed exactly once in the end;
# - every recorded completion (workers record (id, token) in "done" in the
#   same statement as a successful pgjq.complete) is completed per pgjq.job(),
#   and its token is the job's last claim: a completed job is never claimed
#   again (workers record every claim in "claimed" in the claiming statement);
# - nothing exists that was never committed as an enqueue;
# - a job leased before a crash is not handed out before its lease expires,
#   and its holder can still complete it;
# - no job is ever claimed while an earlier claim's lease of it is valid
#   (workers record each claim's lease end), across 20 kill -9s of the
#   postmaster under load (producers, workers and the pgjq worker running);
# - pgjq.verify() finds shared memory and the tables in agreement.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use POSIX ();
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;
use PgjqLoad;

my $postmaster_kills = 20;

# Slots of 100 jobs: the ring wraps many times under the load, so
# truncations and the worker's relocation of stragglers (the held jobs, with
# their 10-minute leases) happen between the kills too.
my $node = PostgreSQL::Test::Cluster->new("pgjq_crash");
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '2s'
restart_after_crash = on
max_connections = 40
pgjq.ring_slot_rows = 100
});
$node->start;

my $tmp = PostgreSQL::Test::Utils::tempdir;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('held', lease => '600 seconds');
});
my $load = load_setup($node, $tmp);

# Let the load run until it has completed $n more jobs (and some were
# produced meanwhile).
sub wait_progress
{
	my ($n, $what) = @_;
	my $target = load_count_done($load) + $n;
	ok( $node->poll_query_until(
			'postgres', "SELECT count(*) >= $target FROM done"),
		"$what: load is making progress");
}

# The worker is back (and serves postgres).
sub wait_worker
{
	my ($what) = @_;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'",
			'1'),
		"$what: the pgjq worker runs");
}

# ------------------------------------------- a lease that spans a crash

# Enqueue and claim one job of queue "held" with a 5-second lease, then
# extend it by heartbeat to 10 minutes: long enough that every check below
# runs inside it however slow the restart, so none of them can be skipped.
# What the restart must keep is the heartbeat's lease (on the ring, its 'h'
# log row), not the claim's.
sub hold
{
	my $id = $node->safe_psql('postgres', "SELECT pgjq.enqueue('held')");
	my ($cid, $token) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT id, token FROM pgjq.claim('held', 1, lease => '5 seconds')");
	is($cid, $id, 'the held job is claimed');
	my $until = $node->safe_psql('postgres',
		"SELECT pgjq.heartbeat($id, $token, '600 seconds')");
	isnt($until, '', 'the held job\'s lease is extended');
	return { id => $id, token => $token, until => $until };
}

# Right after a restart: while the lease runs, the job is running with its
# lease unchanged and nobody else gets it, not even after the worker has run.
sub check_held
{
	my ($h, $what) = @_;
	my $q =
	  "SELECT (SELECT count(*) FROM pgjq.claim('held', 10)) || ',' || (clock_timestamp() < '$h->{until}'::timestamptz)";
	my ($n, $in_lease) = split /,/, $node->safe_psql('postgres', $q);
	my ($state, $until) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT state, lease_until = '$h->{until}'::timestamptz FROM pgjq.job($h->{id})"
	  );
	is($in_lease, 'true', "$what: the check runs inside the lease");
	is($n, '0', "$what: a job leased before the crash is not handed out");
	is($state, 'running', "$what: it is still running");
	is($until, 't', "$what: its lease end is unchanged");
	wait_worker($what);
	sleep 3;    # the worker's first passes (max_sleep is 2 s)
	($n, $in_lease) = split /,/, $node->safe_psql('postgres', $q);
	is($in_lease, 'true', "$what: the second check runs inside the lease");
	is($n, '0',
		"$what: after the worker's passes, the leased job is still not handed out");
}

# ---------------------------------------------------- crash helpers

sub postmaster_pid
{
	my $pidfile = slurp_file($node->data_dir . '/postmaster.pid');
	my ($pid) = split /\n/, $pidfile;
	return $pid;
}

my $restarts = 0;

# kill -9 of the postmaster, then start it again.  The orphaned children
# exit once they notice the postmaster is gone; a new postmaster refuses to
# start while they still hold shared memory.  True when it started.
sub kill_postmaster
{
	my $pm = postmaster_pid();
	my @children = split ' ', `ps -o pid= --ppid $pm`;
	$node->kill9;
	my $deadline = time + 180;
	while (time < $deadline && grep { kill 0, $_ } @children)
	{
		usleep(100_000);
	}
	return 0 if grep { kill 0, $_ } @children;
	for (1 .. 30)
	{
		return 1 if $node->start(fail_ok => 1);
		sleep 1;
	}
	return 0;
}

# After a crash, wait for the postmaster's "reinitializing" and for the
# server to accept connections again.
sub wait_crash_restart
{
	my ($offset, $what) = @_;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/,
		$offset);
	ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
		"$what: the server restarted after the crash");
	$restarts++;
}

# The load processes exit when their connections die; check they did, and
# that their only errors were the lost connections.
sub check_load_ended
{
	my ($what, @bg) = @_;
	for my $bg (@bg)
	{
		my $rc = bg_wait($bg, 120);
		ok(defined $rc, "$what: $bg->{name} ended with the crash");
		bg_stop($bg) unless defined $rc;
		my @errors = load_errors($bg);
		is(scalar(@errors), 0, "$what: $bg->{name} saw no SQL errors")
		  or diag join("\n", @errors);
	}
}

# ================================================================ run

# 1. kill -9 of a client backend while the load runs.
my @load = load_start($load);
wait_progress(400, 'before killing a backend');
my $held = hold();
my $offset = -s $node->logfile;
my $victim = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name IN ('producers', 'workers') AND state = 'active' ORDER BY random() LIMIT 1"
);
$victim ||= $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name IN ('producers', 'workers') LIMIT 1"
);
ok($victim, 'found a pgbench backend to kill');
kill 'KILL', $victim;
wait_crash_restart($offset, 'backend kill');
check_load_ended('backend kill', @load);
check_held($held, 'backend kill');
my ($ok, $in_lease) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT pgjq.complete($held->{id}, $held->{token}), clock_timestamp() < '$held->{until}'::timestamptz"
  );
is($in_lease, 't', 'backend kill: the completion comes inside the lease');
is($ok, 't', 'backend kill: the holder of a lease completes it after the restart');

# 2. kill -9 of the pgjq worker itself.
@load = load_start($load);
wait_progress(400, 'before killing the pgjq worker');
my $worker = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'"
);
ok($worker, 'found the pgjq worker');
$offset = -s $node->logfile;
kill 'KILL', $worker;
wait_crash_restart($offset, 'worker kill');
check_load_ended('worker kill', @load);
wait_worker('worker kill');

# 3. kill -9 of the postmaster.  A second held job has its cancellation
# requested before the crash (on the ring: a 'q' log row the rebuild reads).
@load = load_start($load);
wait_progress(400, 'before killing the postmaster');
$held = hold();
my $cancelled = hold();
is($node->safe_psql('postgres', "SELECT pgjq.cancel($cancelled->{id})"),
	't', 'the second held job\'s cancellation is requested');
ok(kill_postmaster(), 'the server starts after kill -9 of the postmaster')
  or BAIL_OUT('cannot restart the server');
check_load_ended('postmaster kill', @load);
check_held($held, 'postmaster kill');
is( $node->safe_psql(
		'postgres', "SELECT state || ' ' || cancel_requested FROM pgjq.job($cancelled->{id})"),
	'running true',
	'postmaster kill: a requested cancellation survives the crash');
is($node->safe_psql('postgres', "SELECT pgjq.complete($cancelled->{id}, $cancelled->{token})"),
	'f', 'postmaster kill: its holder\'s completion does not complete it');
is($node->safe_psql('postgres', "SELECT state FROM pgjq.job($cancelled->{id})"),
	'cancelled', 'postmaster kill: it ends as cancelled');

# Shorten the lease to a few seconds (a heartbeat sets it to now + extend) so
# that the rescue after its end can be watched.
$held->{until} = $node->safe_psql('postgres',
	"SELECT pgjq.heartbeat($held->{id}, $held->{token}, extend => '3 seconds')");
ok($held->{until}, 'postmaster kill: the holder still heartbeats after the restart');

# The held job comes back once its lease has expired (the worker rescues it),
# with a new token; the old one is stale.
ok( $node->poll_query_until(
		'postgres',
		"SELECT state IN ('scheduled', 'ready') FROM pgjq.job($held->{id})"),
	'postmaster kill: the held job is rescued once its lease expires');
is( $node->safe_psql(
		'postgres',
		"SELECT clock_timestamp() >= '$held->{until}'::timestamptz"),
	't',
	'postmaster kill: the rescue did not come before the lease end');
ok( $node->poll_query_until(
		'postgres', "SELECT state = 'ready' FROM pgjq.job($held->{id})"),
	'postmaster kill: the held job becomes ready again');
my ($cid, $ctoken) = split /\|/,
  $node->safe_psql('postgres', "SELECT id, token FROM pgjq.claim('held', 10)");
is($cid, $held->{id}, 'postmaster kill: the held job is claimed again');
isnt($ctoken, $held->{token}, 'postmaster kill: with a new token');
is( $node->safe_psql(
		'postgres',
		"SELECT pgjq.complete($held->{id}, $held->{token})::text || ',' || pgjq.complete($cid, $ctoken)::text"
	),
	'false,true',
	'postmaster kill: the old token is stale, the new one completes');

# 3b. kill -9 of the postmaster under load, again and again: producers,
# workers and the pgjq worker are all running each time it dies.
my $kills = 1;
my @kill_failures;
for my $round (1 .. $postmaster_kills - 1)
{
	@load = load_start($load);
	my $target = load_count_done($load) + 20;
	$node->poll_query_until('postgres', "SELECT count(*) >= $target FROM done")
	  or push @kill_failures, "round $round: no progress before the kill";
	usleep(int(rand(500_000)));    # die at a random point of the load
	kill_postmaster() or BAIL_OUT("round $round: cannot restart the server");
	$kills++;
	for my $bg (@load)
	{
		my $rc = bg_wait($bg, 120);
		bg_stop($bg) unless defined $rc;
		my @errors = load_errors($bg);
		push @kill_failures, "round $round: $bg->{name}: @errors" if @errors;
	}
}
is(join("\n", @kill_failures), '', "$kills postmaster kills under load: progress each time, no SQL errors");

# 4. Drain: workers only, until every committed enqueue is completed.
load_drain($load);

# ================================================================ checks

my $nproduced = ledger_checks($load, 'crashes');
cmp_ok($nproduced, '>', 600, 'a fair amount of work was produced');
cmp_ok($restarts, '==', 2, 'two crash restarts happened');
cmp_ok($kills, '==', $postmaster_kills, "$postmaster_kills postmaster kills happened");

verify_ok($node, 'postgres', 'after the crashes, shared memory and the tables agree');
{
	my @copies = slurp_file($node->logfile) =~ /pgjq: copying \d+ unfinished jobs/g;
	note(scalar(@copies) . ' relocations of stragglers');
	cmp_ok(scalar(@copies), '>', 0,
		'the ring wrapped around the held jobs: their slots were relocated between the kills');
}

$node->stop;
done_testing();
