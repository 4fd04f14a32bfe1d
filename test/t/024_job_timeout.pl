
# Copyright (c) pgjq contributors
#
# A job's own execution deadline (enqueue(..., timeout => ...)) ends its
# attempt on time, whatever its holder's heartbeats did meanwhile (test/
# BUGS.md, "A timed-out job stays running").
#
# The worker rescues a lease when it ends, but skips a claim that an open
# transaction is extending (a heartbeat) or closing (complete, fail): that
# transaction's commit or abort decides.  In 0.2.0 neither woke the worker
# once the claim was open again: a heartbeat's commit woke it from a
# callback that ran before the ring's own had published the claim, and an
# abort woke no one.  So a worker that had looked while the claim was being
# extended slept pgjq.max_sleep (10 s here, the default) past the deadline,
# the job still running, attempt 1, no error.
#
# Each case: a queue with a long backoff (1 hour) and a job with a 1 s
# timeout, claimed; then the job must be a retry ('scheduled', or 'dead' at
# its last attempt) with the timeout's error within $bound s of the moment
# the claim was open again (a rollback or commit after the deadline, or the
# first heartbeat that answered NULL):
# - a heartbeat's transaction rolled back after the deadline;
# - likewise a savepoint rolled back (the transaction stays open);
# - a heartbeat's transaction committed after the deadline;
# - heartbeats every 0.1 s in autocommit until one answers NULL (each
#   commit woke the worker before the claim was published: a race, lost
#   in about one trial of three), 6 trials;
# - a job claimed from pgjq.job's ready rows (retry_dead) rather than from
#   the ring's bodies, and a retry (attempt 2) promoted from pgjq.job.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $bound = 3;    # seconds; pgjq.max_sleep is 10 s

my $node = PostgreSQL::Test::Cluster->new('job_timeout');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{CREATE EXTENSION pgjq;
      SELECT pgjq.create_queue('t', backoff_base => '1 hour');});
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pgjq worker'")
  or die 'no worker';

my $h = $node->background_psql('postgres', on_error_stop => 1);

# Claim one job of queue t: (id, token, deadline as epoch).
sub claim_one
{
	my ($row) = @_;
	my ($id, $token, $deadline) = split /\|/, sql(
		"SELECT id, token, extract(epoch FROM lease_until) FROM pgjq.claim('t')");
	die 'nothing claimed' unless $id;
	return ($id, $token, $deadline);
}

sub enqueue_one
{
	my ($max_attempts) = @_;
	return sql("SELECT pgjq.enqueue('t', '{}', timeout => '1 s', max_attempts => $max_attempts)");
}

# Seconds from $t0 until job $id is no longer running (undef after 30 s),
# and its "state|attempt|last_error" then.
sub until_rescued
{
	my ($id, $t0) = @_;
	for (1 .. 1500)
	{
		my $row = sql("SELECT state || '|' || attempt || '|' || coalesce(last_error, '') FROM pgjq.job($id)");
		# (an empty row: the job is between places for a moment)
		return (time - $t0, $row) if $row ne '' && $row !~ /^running\|/;
		usleep(20_000);
	}
	return (undef, sql("SELECT state || '|' || attempt FROM pgjq.job($id)"));
}

sub sleep_past { my ($deadline) = @_; my $d = $deadline + 0.5 - time; usleep($d * 1e6) if $d > 0; }

sub rescued_ok
{
	my ($id, $t0, $expect, $what) = @_;
	my ($took, $row) = until_rescued($id, $t0);
	ok(defined $took && $took < $bound, "$what: the attempt ends within $bound s")
	  or diag('took ' . ($took // 'over 30') . " s; job: $row");
	like($row, qr/^$expect\|timed out: still running at its execution deadline/,
		"$what: ended as $expect, with the timeout's error");
}

# a heartbeat's transaction, open past the deadline, rolled back
{
	my $id = enqueue_one(20);
	my ($cid, $token, $deadline) = claim_one();
	$h->query_safe('BEGIN');
	isnt($h->query_safe("SELECT pgjq.heartbeat($id, $token)"), '', 'heartbeat before the deadline');
	sleep_past($deadline);
	$h->query_safe('ROLLBACK');
	rescued_ok($id, time, 'scheduled\|1', 'heartbeat rolled back after the deadline');
}

# the same with a savepoint; the transaction stays open
{
	my $id = enqueue_one(20);
	my ($cid, $token, $deadline) = claim_one();
	$h->query_safe('BEGIN');
	$h->query_safe('SAVEPOINT s');
	$h->query_safe("SELECT pgjq.heartbeat($id, $token)");
	sleep_past($deadline);
	$h->query_safe('ROLLBACK TO SAVEPOINT s');
	rescued_ok($id, time, 'scheduled\|1', 'heartbeat rolled back to a savepoint after the deadline');
	$h->query_safe('COMMIT');
}

# a heartbeat's transaction committed after the deadline
{
	my $id = enqueue_one(20);
	my ($cid, $token, $deadline) = claim_one();
	$h->query_safe('BEGIN');
	$h->query_safe("SELECT pgjq.heartbeat($id, $token)");
	sleep_past($deadline);
	$h->query_safe('COMMIT');
	rescued_ok($id, time, 'scheduled\|1', 'heartbeat committed after the deadline');
}

# heartbeats in autocommit until one answers NULL, each from a new session
# (as a worker process per job would), ~10 per second
for my $trial (1 .. 6)
{
	my $id = enqueue_one(20);
	my ($cid, $token, $deadline) = claim_one();
	my $t0;
	for (1 .. 500)
	{
		if (sql("SELECT pgjq.heartbeat($id, $token) IS NULL") eq 't')
		{
			$t0 = time;
			last;
		}
		usleep(90_000);
	}
	ok(defined $t0 && $t0 < $deadline + 1, "heartbeat loop $trial: NULL once the deadline passed");
	rescued_ok($id, $t0 // time, 'scheduled\|1', "heartbeat loop $trial");
}

# a job claimed from pgjq.job's ready rows: dead, redriven by retry_dead
{
	my $id = enqueue_one(1);
	my ($cid, $token) = claim_one();
	is(sql("SELECT pgjq.fail($id, $token, 'boom')"), 'dead', 'a job at its last attempt fails: dead');
	is(sql(q{SELECT pgjq.retry_dead('t')}), '1', 'retry_dead makes it a ready row of pgjq.job');
	my (undef, $token2, $deadline) = claim_one();
	$h->query_safe('BEGIN');
	$h->query_safe("SELECT pgjq.heartbeat($id, $token2)");
	sleep_past($deadline);
	$h->query_safe('ROLLBACK');
	rescued_ok($id, time, 'dead\|1', 'a job claimed from pgjq.job, at its last attempt');
}

# a retry promoted from pgjq.job (attempt 2)
{
	my $id = enqueue_one(20);
	my ($cid, $token) = claim_one();
	is(sql("SELECT pgjq.fail($id, $token, 'boom', retry_in => '0')"), 'retry', 'a failed attempt: a retry');
	$node->poll_query_until('postgres', "SELECT state = 'ready' FROM pgjq.job($id)")
	  or die 'the retry was not promoted';
	my (undef, $token2, $deadline) = claim_one();
	$h->query_safe('BEGIN');
	$h->query_safe("SELECT pgjq.heartbeat($id, $token2)");
	sleep_past($deadline);
	$h->query_safe('ROLLBACK');
	rescued_ok($id, time, 'scheduled\|2', 'a retry promoted from pgjq.job, attempt 2');
}

$h->quit;
$node->stop;
done_testing();
