
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

my $postmaster_kills = 20;

my $node = PostgreSQL::Test::Cluster->new('pgjq_crash');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '2s'
restart_after_crash = on
max_connections = 40
});
$node->start;

my $tmp = PostgreSQL::Test::Utils::tempdir;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('c', lease => '3 seconds', max_attempts => 1000,
                         backoff_base => '100 milliseconds', backoff_max => '1 second');
SELECT pgjq.create_queue('held', lease => '600 seconds');
CREATE TABLE produced (id bigint NOT NULL);
CREATE TABLE claimed (id bigint NOT NULL, token bigint NOT NULL,
                      at timestamptz NOT NULL DEFAULT clock_timestamp(),
                      lease_until timestamptz, lease interval);
CREATE TABLE done (id bigint NOT NULL, token bigint NOT NULL,
                   at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON claimed (id);
CREATE INDEX ON done (id);
});

# ------------------------------------------------------ pgbench scripts

sub write_script
{
	my ($name, $text) = @_;
	my $path = "$tmp/$name.sql";
	open my $fh, '>', $path or die "could not write $path: $!";
	print $fh $text;
	close $fh;
	return $path;
}

# Producers: the enqueue and the record of its id commit together.
my $produce_one = write_script('produce_one',
	"INSERT INTO produced SELECT pgjq.enqueue('c', jsonb_build_object('r', random()));\n"
);
my $produce_many = write_script('produce_many',
	"INSERT INTO produced SELECT pgjq.enqueue_many('c', ARRAY['{\"n\":1}', '{\"n\":2}', '{\"n\":3}']::jsonb[]);\n"
);

# Workers: claim (recorded with the claim), then, in a second transaction as
# a real worker would, complete each job and record the success with it.
my $work = write_script(
	'work', q{WITH c AS (SELECT id, token, lease_until FROM pgjq.claim('c', 3, lease => '3 seconds')),
     l AS (INSERT INTO claimed (id, token, lease_until, lease)
           SELECT id, token, lease_until, '3 seconds' FROM c RETURNING id, token)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens FROM l \gset
INSERT INTO done (id, token)
  SELECT i, t FROM unnest(':ids'::bigint[], ':tokens'::bigint[]) AS u(i, t)
   WHERE pgjq.complete(i, t);
});

# A worker that dies silently: its lease must expire and be rescued.
my $abandon = write_script('abandon',
	"INSERT INTO claimed (id, token, lease_until, lease) SELECT id, token, lease_until, '2 seconds' FROM pgjq.claim('c', 1, lease => '2 seconds');\n"
);

# --------------------------------------------------- background processes

my $nbg = 0;

# Start a command in the background, output to files; returns [pid, name].
sub start_bg
{
	my ($name, @cmd) = @_;
	$nbg++;
	my $out = "$tmp/$name.$nbg.out";
	my $err = "$tmp/$name.$nbg.err";
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		$ENV{PGAPPNAME} = $name;    # pg_stat_activity tells the load apart
		open STDOUT, '>', $out or POSIX::_exit(126);
		open STDERR, '>', $err or POSIX::_exit(126);
		exec @cmd or POSIX::_exit(127);
	}
	return { pid => $pid, name => $name, out => $out, err => $err };
}

# Wait up to $secs for a background process to exit; returns its exit code,
# or undef if it is still running.
sub wait_bg
{
	my ($bg, $secs) = @_;
	my $deadline = time + $secs;
	while (time < $deadline)
	{
		my $r = waitpid($bg->{pid}, POSIX::WNOHANG());
		if ($r == $bg->{pid})
		{
			$bg->{status} = $? >> 8;
			return $bg->{status};
		}
		usleep(100_000);
	}
	return undef;
}

sub stop_bg
{
	my ($bg) = @_;
	return $bg->{status} if defined $bg->{status};
	kill 'TERM', $bg->{pid};
	my $rc = wait_bg($bg, 30);
	if (!defined $rc)
	{
		kill 'KILL', $bg->{pid};
		$rc = wait_bg($bg, 30);
	}
	return $rc;
}

my @all_bg;

sub pgbench
{
	my ($name, @args) = @_;
	my $bg = start_bg(
		$name, 'pgbench', '-n', '-h', $node->host, '-p', $node->port,
		'-T', '900', @args, 'postgres');
	push @all_bg, $bg;
	return $bg;
}

sub start_load
{
	return (
		pgbench(
			'producers', '-c', '2', '-j', '2', '-R', '150',
			'-f', "$produce_one\@3", '-f', "$produce_many\@1"),
		pgbench(
			'workers', '-c', '3', '-j', '3', '-f', "$work\@20",
			'-f', "$abandon\@1"));
}

sub count_done
{
	return $node->safe_psql('postgres', 'SELECT count(*) FROM done');
}

# Let the load run until it has completed $n more jobs (and some were
# produced meanwhile).
sub wait_progress
{
	my ($n, $what) = @_;
	my $target = count_done() + $n;
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

# Enqueue and claim one job of queue "held" with a 10-minute lease: long
# enough that every check below runs inside it however slow the restart, so
# none of them can be skipped.
sub hold
{
	my $id = $node->safe_psql('postgres', "SELECT pgjq.enqueue('held')");
	my ($cid, $token, $until) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT id, token, lease_until FROM pgjq.claim('held', 1, lease => '600 seconds')"
	  );
	is($cid, $id, 'the held job is claimed');
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
		my $rc = wait_bg($bg, 120);
		ok(defined $rc, "$what: $bg->{name} ended with the crash");
		stop_bg($bg) unless defined $rc;
		my $err = slurp_file($bg->{err});
		my @errors = grep { /ERROR:/ } split /\n/, $err;
		is(scalar(@errors), 0, "$what: $bg->{name} saw no SQL errors")
		  or diag join("\n", @errors);
	}
}

# ================================================================ run

# 1. kill -9 of a client backend while the load runs.
my @load = start_load();
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
@load = start_load();
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

# 3. kill -9 of the postmaster.
@load = start_load();
wait_progress(400, 'before killing the postmaster');
$held = hold();
ok(kill_postmaster(), 'the server starts after kill -9 of the postmaster')
  or BAIL_OUT('cannot restart the server');
check_load_ended('postmaster kill', @load);
check_held($held, 'postmaster kill');

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
	@load = start_load();
	my $target = count_done() + 20;
	$node->poll_query_until('postgres', "SELECT count(*) >= $target FROM done")
	  or push @kill_failures, "round $round: no progress before the kill";
	usleep(int(rand(500_000)));    # die at a random point of the load
	kill_postmaster() or BAIL_OUT("round $round: cannot restart the server");
	$kills++;
	for my $bg (@load)
	{
		my $rc = wait_bg($bg, 120);
		stop_bg($bg) unless defined $rc;
		my @errors = grep { /ERROR:/ } split /\n/, slurp_file($bg->{err});
		push @kill_failures, "round $round: $bg->{name}: @errors" if @errors;
	}
}
is(join("\n", @kill_failures), '', "$kills postmaster kills under load: progress each time, no SQL errors");

# 4. Drain: workers only, until every committed enqueue is completed.
my $drain = pgbench('drain', '-c', '2', '-j', '2', '-f', $work);
ok( $node->poll_query_until(
		'postgres',
		'SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = p.id)',
		'0'),
	'every committed enqueue is completed in the end');
stop_bg($drain);
my @errors = grep { /ERROR:/ } split /\n/, slurp_file($drain->{err});
is(scalar(@errors), 0, 'the drain saw no SQL errors') or diag join("\n", @errors);

# ================================================================ checks

my ($nproduced, $nclaimed, $ndone) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT (SELECT count(*) FROM produced), (SELECT count(*) FROM claimed), (SELECT count(*) FROM done)'
  );
note "produced $nproduced, claims $nclaimed, completions $ndone, crash restarts $restarts";
cmp_ok($nproduced, '>', 600, 'a fair amount of work was produced');

is($node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT id) FROM produced'),
	'0', 'enqueue never returned the same id twice');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM pgjq.job(p.id))'
	),
	'0',
	'no committed enqueue was lost');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM (SELECT id FROM done GROUP BY id HAVING count(*) > 1) x'
	),
	'0',
	'no job was completed twice');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM done d, LATERAL pgjq.job(d.id) j WHERE j.state <> 'completed'"
	),
	'0',
	'every recorded completion is completed per pgjq.job()');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM done d WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.id = d.id)'
	),
	'0',
	'nothing was completed that was not committed as an enqueue');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM done d
		   WHERE d.token IS DISTINCT FROM
		         (SELECT c.token FROM claimed c WHERE c.id = d.id ORDER BY c.at DESC LIMIT 1)}
	),
	'0',
	'a completed job was never claimed again (its completion token is its last claim)');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM claimed c WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.id = c.id)'
	),
	'0',
	'nothing was claimed that was not committed as an enqueue');
is( $node->safe_psql(
		'postgres',
		"SELECT ready || ',' || scheduled || ',' || running || ',' || dead || ',' || cancelled || ',' || completed FROM pgjq.queue_stats WHERE queue = 'c'"
	),
	"0,0,0,0,0,$nproduced",
	'queue_stats: every job completed, none left, none extra');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('c', 1000)"),
	'0', 'nothing is left to claim');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM (
		    SELECT lease_until - lease AS start,
		           lag(lease_until) OVER (PARTITION BY id ORDER BY token) AS prev_until
		      FROM claimed WHERE lease_until IS NOT NULL) c
		   WHERE start < prev_until}
	),
	'0',
	'no job was claimed again while an earlier lease of it was still valid (crashes included)');
cmp_ok($restarts, '==', 2, 'two crash restarts happened');
cmp_ok($kills, '==', $postmaster_kills, "$postmaster_kills postmaster kills happened");

verify_ok($node, 'postgres', 'after the crashes, shared memory and the tables agree');

$node->stop;
done_testing();
