
# Copyright (c) pgjq contributors
#
# Waiting claims, await() and the concurrency limits' shared-memory counters,
# where several sessions, a crash or a server without the preload are needed:
#
# - a claim with wait is woken by another session's commit (an enqueue, a
#   promotion, a resume), and only at the commit: an enqueue whose
#   transaction is still open, or that rolls back, wakes nobody;
# - claim(ARRAY['a', 'b'], wait) is woken by a job in b;
# - the wait ends by itself (nothing claimed), and statement_timeout and
#   pg_cancel_backend() interrupt it (57014);
# - one job wakes one of three waiters; the other two sleep to the end;
# - CALL pgjq.await() returns when a job comes, and does not hold back the
#   xmin horizon while it sleeps (pg_stat_activity.backend_xmin is NULL),
#   unlike a waiting claim;
# - the limit counters are rebuilt from the tables after a crash restart:
#   jobs claimed before the crash still count;
# - without shared_preload_libraries CREATE EXTENSION fails (55000, with a
#   hint); on an extension created with the preload, after a restart
#   without it, the features that need shared memory (limits, waits, every
#   enqueue, claim and outcome) raise object_not_in_prerequisite_state
#   (55000) with a hint.
#
# Timing: waiting claims are started in background psql sessions, and a wake
# up is only tried once pg_stat_activity shows the claim sleeping (wait_event
# "Extension"); every such wait is a poll.  "Woken" means the claim returned
# well before its wait would have ended: the waits are 60 s, the bound is
# 20 s after the waking commit.  That a claim is *not* woken is checked by
# seeing it still asleep a while after the event (a pause here can only make
# the test pass less often if the implementation is wrong, never fail it
# when it is right).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $long_wait = 60;     # seconds: the wait of a claim that should be woken
my $woken_within = 20;  # seconds after the waking commit, on a loaded machine

my $node = PostgreSQL::Test::Cluster->new('wait_limits');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.max_wait = '2min'
restart_after_crash = on
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('q');
SELECT pgjq.create_queue('a');
SELECT pgjq.create_queue('b');
});

# --------------------------------------------------------------- helpers

my $marker_no = 0;

# Start $sql in a new background session; return once the backend sleeps in
# a waiting claim or await() (wait_event "Extension" on PostgreSQL 15, "PgjqClaim" or "PgjqWaitJobs" on 18).  The statement's
# output is collected by finish().
sub start_waiting
{
	my ($sql, %opt) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	$marker_no++;
	my $marker = "end of waiter $marker_no";
	$s->{stdin} .= "$sql;\n\\echo '$marker'\n\\warn '$marker'\n";
	$s->{run}->pump_nb();
	my $w = { s => $s, pid => $pid, marker => $marker };
	ok( $node->poll_query_until(
			'postgres',
			"SELECT wait_event_type = 'Extension' AND wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs')
			   FROM pg_stat_activity WHERE pid = $pid"),
		"$opt{name}: the backend sleeps");
	return $w;
}

# Is the waiter still sleeping (its statement not finished)?
sub still_waiting
{
	my ($w) = @_;
	$w->{s}{run}->pump_nb();
	return 0 if $w->{s}{stdout} =~ /$w->{marker}/;
	return $node->safe_psql('postgres',
		"SELECT wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs') FROM pg_stat_activity WHERE pid = $w->{pid}"
	) eq 't';
}

# Wait for the waiter's statement to finish; return (stdout, stderr, the
# time it finished) and close the session.
sub finish
{
	my ($w) = @_;
	my $s = $w->{s};
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/$w->{marker}\n/)
	  or die "waiter $w->{pid} did not finish";
	my $at = time();
	pump_until($s->{run}, $s->{timeout}, \$s->{stderr}, qr/$w->{marker}\n/);
	my ($out, $err) = ($s->{stdout}, $s->{stderr});
	$out =~ s/\n?$w->{marker}\n//;
	$err =~ s/\n?$w->{marker}\n//;
	$s->quit;
	return ($out, $err, $at);
}

# A waiting claim of one job that prints "jobs|queue|seconds": how many jobs
# it got, the queue of the job (every job's payload names its queue: "q"),
# and how long the statement took.
sub claim_sql
{
	my ($queues, $wait) = @_;
	return "SELECT count(*) || '|' || coalesce(min(payload->>'q'), '') || '|' "
	  . "|| extract(epoch FROM clock_timestamp() - statement_timestamp()) "
	  . "FROM pgjq.claim($queues, wait => '$wait')";
}

# "jobs|queue" of claim_sql's output
sub got { my ($out) = @_; $out =~ s/\|[^|]*$//; return $out; }

# the seconds of claim_sql's output
sub took { my ($out) = @_; return (split /\|/, $out)[2]; }

# Pause long enough for a wrongly woken waiter to have returned.
sub settle { usleep(1_500_000); }

# ======================================== woken by a commit, and only then

{
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'enqueue commit');
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 1}')");
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|q', 'a waiting claim gets the job another session enqueued');
	is($err, '', '... without error');
	cmp_ok($at - $t0, '<', $woken_within,
		'... woken by the commit, well before its wait ends');
}

{
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'open producer transaction');
	my $p = $node->background_psql('postgres');
	$p->query_safe("BEGIN");
	$p->query_safe("SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 2}')");
	settle();
	ok(still_waiting($w),
		'an enqueue whose transaction is open does not wake the waiting claim');
	my $t0 = time();
	$p->query_safe("COMMIT");
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|q', '... its commit does, and the claim gets the job');
	cmp_ok($at - $t0, '<', $woken_within, '... promptly after the commit');
	$p->quit;
}

{
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'rolled-back enqueue');
	$node->safe_psql('postgres',
		"BEGIN; SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 3}'); ROLLBACK;");
	settle();
	ok(still_waiting($w), 'a rolled-back enqueue does not end the wait');
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 4}')");
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|q', '... and the waiter is still woken by the next commit');
	cmp_ok($at - $t0, '<', $woken_within, '... promptly');
}

# a delayed job, promoted by hand
{
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'promotion');
	my $did = $node->safe_psql('postgres',
		"SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 5}', delay => '1 second')");
	settle();
	ok(still_waiting($w), 'the commit of a delayed job does not end the wait');
	$node->poll_query_until('postgres',
		"SELECT state = 'scheduled' AND run_at <= clock_timestamp() FROM pgjq.job($did)"
	);
	my $t0 = time();
	is($node->safe_psql('postgres', 'SELECT pgjq.promote()'),
		'1', 'promote() makes the delayed job ready');
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|q', 'the promotion wakes the waiting claim, which gets the job');
	cmp_ok($at - $t0, '<', $woken_within, '... promptly');
}

# resume of a paused queue
{
	$node->safe_psql('postgres',
		"SELECT pgjq.pause('q'); SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 6}');");
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'paused queue');
	settle();
	ok(still_waiting($w), 'a paused queue with a ready job keeps the claim waiting');
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.resume('q')");
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|q', 'resume() wakes the waiting claim, which gets the job');
	cmp_ok($at - $t0, '<', $woken_within, '... promptly');
}

# several queues
{
	my $w = start_waiting(claim_sql("ARRAY['a', 'b']", "$long_wait s"),
		name => 'claim from a and b');
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('b', '{\"q\": \"b\", \"n\": 7}')");
	my ($out, $err, $at) = finish($w);
	is(got($out), '1|b', 'a wait on ARRAY[a, b] is woken by a job in b');
	cmp_ok($at - $t0, '<', $woken_within, '... promptly');
}

# ============================================ the end of a wait, interrupts

{
	my $t0 = time();
	my $out = $node->safe_psql('postgres', claim_sql("'q'", '1 s'));
	my $took = time() - $t0;
	is(got($out), '0|', 'a wait that nothing ends returns no job');
	cmp_ok($took, '>=', 0.95, '... after its wait');
	cmp_ok($took, '<', $woken_within, '... not much longer');
}

{
	my $t0 = time();
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '500ms';\n" . claim_sql("'q'", "$long_wait s"),
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	my $took = time() - $t0;
	isnt($ret, 0, 'statement_timeout ends a waiting claim with an error');
	like($err, qr/57014/, '... query_canceled (57014)');
	like($err, qr/canceling statement due to statement timeout/, '... saying why');
	cmp_ok($took, '<', $woken_within, '... at the timeout, not at the end of the wait');
}

{
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'cancel');
	my $t0 = time();
	is($node->safe_psql('postgres', "SELECT pg_cancel_backend($w->{pid})"),
		't', 'pg_cancel_backend() signals the waiting backend');
	my ($out, $err, $at) = finish($w);
	like($err, qr/canceling statement due to user request/,
		'... which ends its claim with an error');
	cmp_ok($at - $t0, '<', $woken_within, '... at once');
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs')"
			  . " AND backend_type = 'client backend'"),
		'0', 'no backend is left waiting');
}

# ======================================= one job wakes one of three waiters

{
	my $wait = 15;
	my @w = map {
		start_waiting(claim_sql("'q'", "$wait s"), name => "waiter $_ of 3")
	} (1 .. 3);
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 8}')");
	# the first to return must be the woken one, long before the others
	$node->poll_query_until('postgres',
		"SELECT count(*) = 2 FROM pg_stat_activity WHERE wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs')"
		  . " AND pid IN ($w[0]{pid}, $w[1]{pid}, $w[2]{pid})");
	my $first = time() - $t0;
	cmp_ok($first, '<', $wait - 5, 'one waiter returns soon after the job commits');
	settle();
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs')"
			  . " AND pid IN ($w[0]{pid}, $w[1]{pid}, $w[2]{pid})"),
		'2',
		'the other two keep waiting');
	my @outs = map { (finish($_))[0] } @w;
	is_deeply([ sort map { got($_) } @outs ], [ '0|', '0|', '1|q' ],
		'exactly one waiter got the job, the other two nothing');
	my @empty = grep { got($_) eq '0|' } @outs;
	is(scalar(grep { took($_) >= $wait - 0.1 } @empty), 2,
		'the two others returned only when their wait ended')
	  or diag explain \@outs;
}

# ========================================== await() and the xmin horizon

{
	# the waiting claim keeps the statement's snapshot: backend_xmin is set
	my $w = start_waiting(claim_sql("'q'", "$long_wait s"),
		name => 'claim for xmin');
	my $xmin_claim = $node->safe_psql('postgres',
		"SELECT coalesce(backend_xmin::text, 'NULL') FROM pg_stat_activity WHERE pid = $w->{pid}"
	);
	note "backend_xmin of a backend in claim(..., wait): $xmin_claim";
	isnt($xmin_claim, 'NULL', 'a waiting claim shows a backend_xmin');
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 9}')");
	is(got((finish($w))[0]), '1|q', '... (and is woken as usual)');

	# await() sleeps without a snapshot
	$w = start_waiting("CALL pgjq.await(ARRAY['a', 'q'], '$long_wait s')",
		name => 'await');
	my $xmin_await = $node->safe_psql('postgres',
		"SELECT coalesce(backend_xmin::text, 'NULL') || ' ' || coalesce(backend_xid::text, 'NULL')"
		  . " FROM pg_stat_activity WHERE pid = $w->{pid}");
	note "backend_xmin, backend_xid of a backend in CALL pgjq.await(): $xmin_await";
	is($xmin_await, 'NULL NULL',
		'a backend in CALL await() holds no snapshot and no xid: backend_xmin is NULL');
	settle();
	ok(still_waiting($w), 'await() waits while there is nothing');
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('q', '{\"q\": \"q\", \"n\": 10}')");
	my ($out, $err, $at) = finish($w);
	is($err, '', 'await() returns without error');
	cmp_ok($at - $t0, '<', $woken_within, '... when a job is enqueued');
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pgjq.claim('q', 10)"),
		'1', '... and the job is there to claim');

	# a queue at its concurrency limit does not end await(); a completion
	# that frees a slot does
	$node->safe_psql('postgres',
		"SELECT pgjq.create_queue('full', concurrency => 1);"
		  . " SELECT count(*) FROM pgjq.enqueue_many('full', array_fill('{}'::jsonb, ARRAY[2]))");
	my ($fid, $ftoken) = split /,/,
	  $node->safe_psql('postgres',
		"SELECT id || ',' || token FROM pgjq.claim('full')");
	$w = start_waiting("CALL pgjq.await(ARRAY['full'], '$long_wait s')",
		name => 'await on a full queue');
	settle();
	ok(still_waiting($w), 'a ready job of a queue at its limit does not end await()');
	$t0 = time();
	$node->safe_psql('postgres', "SELECT pgjq.complete($fid, $ftoken)");
	($out, $err, $at) = finish($w);
	cmp_ok($at - $t0, '<', $woken_within, '... a completion that frees a slot does');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('full', 5)"),
		'1', '... and the job can be claimed');

	# what it means: rows deleted while a claim waits cannot be vacuumed
	# away; rows deleted while await() sleeps can
	$node->safe_psql('postgres',
		'CREATE TABLE horizon (n int) WITH (autovacuum_enabled = off);'
		  . ' INSERT INTO horizon SELECT generate_series(1, 200)');
	$w = start_waiting(claim_sql("'a'", "$long_wait s"),
		name => 'claim during vacuum');
	$node->safe_psql('postgres', 'DELETE FROM horizon WHERE n <= 100');
	my ($r, $vout, $verr) = $node->psql('postgres', 'VACUUM (VERBOSE) horizon');
	like($verr, qr/100 are dead but not yet removable/,
		'VACUUM cannot remove rows deleted while a claim waits');
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('a', '{}')");
	finish($w);
	$node->safe_psql('postgres', 'VACUUM horizon');
	$w = start_waiting("CALL pgjq.await(ARRAY['a'], '$long_wait s')",
		name => 'await during vacuum');
	$node->safe_psql('postgres', 'DELETE FROM horizon');
	($r, $vout, $verr) = $node->psql('postgres', 'VACUUM (VERBOSE) horizon');
	like($verr, qr/tuples: 100 removed, 0 remain, 0 are dead but not yet removable/,
		'VACUUM removes rows deleted while await() sleeps');
	$node->safe_psql('postgres', "SELECT pgjq.enqueue('a', '{}')");
	finish($w);
	$node->safe_psql('postgres',
		"DROP TABLE horizon; SELECT count(*) FROM pgjq.claim('a', 10)");
}

# ====================================== concurrency limits across a crash

{
	$node->safe_psql(
		'postgres', q{
SELECT pgjq.create_queue('lim', concurrency => 2, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('lim', array_fill('{}'::jsonb, ARRAY[5]));
SELECT pgjq.create_queue('klim', key_concurrency => 1, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('klim', array_fill('{}'::jsonb, ARRAY[4]),
                                       fair_keys => ARRAY['a', 'a', 'b', 'b']);
});
	my @held = split /\n/,
	  $node->safe_psql('postgres',
		"SELECT id || ',' || token FROM pgjq.claim('lim', 5) ORDER BY id");
	is(scalar(@held), 2, 'concurrency 2: a claim gets 2 jobs');
	my $k = $node->safe_psql('postgres',
		"SELECT id || ',' || token FROM pgjq.claim('klim', 1)");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM pgjq.claim('klim', 5)"),
		'1', 'key_concurrency 1: the other key gives one more');

	$node->stop('immediate');
	$node->start;

	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('lim', 5)"),
		'0', 'after a crash restart the two running jobs still count: nothing to claim');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('klim', 5)"),
		'0', '... and both keys are still at their limit');
	is( $node->safe_psql('postgres',
			"SELECT running FROM pgjq.queue_stats WHERE queue = 'lim'"),
		'2', '... the jobs are still running');

	my ($id, $token) = split /,/, $held[0];
	is($node->safe_psql('postgres', "SELECT pgjq.complete($id, $token)"),
		't', 'a job claimed before the crash is completed with its saved token');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('lim', 5)"),
		'1', '... which frees exactly one slot');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('lim', 5)"),
		'0', '... and no more');
	($id, $token) = split /,/, $k;
	is($node->safe_psql('postgres', "SELECT pgjq.complete($id, $token)"),
		't', 'the key-limited job claimed before the crash is completed');
	is( $node->safe_psql('postgres',
			"SELECT string_agg(fair_key, ',') FROM pgjq.claim('klim', 5)"),
		'a', '... which frees its key, and only that key');
	is( $node->safe_psql('postgres',
			"SELECT running <= 2 FROM pgjq.queue_stats WHERE queue = 'lim'"),
		't', 'the limit still holds');
}

# ================================================ without the preload

# The ring engine keeps the claimable jobs in shared memory: CREATE
# EXTENSION refuses a server without the preload.  What needs shared memory
# is then checked on the extension created above, with the preload, after a
# restart without it.
{
	# ring jobs: five running (claimed with the preload), one ready
	my (@rid, @rtok);
	for (split /\n/, $node->safe_psql('postgres',
		"SELECT count(*) FROM pgjq.enqueue_many('q', array_fill('{}'::jsonb, ARRAY[5]));"
		  . " SELECT id || ',' || token FROM pgjq.claim('q', 5, lease => '1 hour') ORDER BY id"))
	{
		next unless /,/;
		my ($i, $t) = split /,/;
		push @rid, $i;
		push @rtok, $t;
	}
	is(scalar(@rid), 5, 'five ring jobs are running when the preload is taken away');
	my $ready_ring = $node->safe_psql('postgres', "SELECT pgjq.enqueue('q')");
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = ''\nmax_prepared_transactions = 2");
	$node->restart;

	$node->safe_psql('postgres', 'CREATE DATABASE np');
	my ($ret, $out, $err) = $node->psql('np', 'CREATE EXTENSION pgjq',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	isnt($ret, 0, 'without shared_preload_libraries CREATE EXTENSION pgjq fails');
	like($err, qr/ERROR:\s+55000:/, '... with object_not_in_prerequisite_state (55000)');
	like($err, qr/HINT:.*shared_preload_libraries/,
		'... and a hint naming shared_preload_libraries');
	is($node->safe_psql('np', "SELECT count(*) FROM pg_extension WHERE extname = 'pgjq'"),
		'0', '... and leaves no extension behind');

	my @cases = (
		[ "SELECT pgjq.create_queue('np', concurrency => 1)", 'create_queue with a limit' ],
		[ "SELECT pgjq.alter_queue('q', rate => 5)", 'alter_queue with a limit' ],
		[ "SELECT * FROM pgjq.claim('q', wait => '1 s')", 'claim with wait' ],
		[ "SELECT * FROM pgjq.claim(ARRAY['q'], wait => '1 s')", 'claim(queues[]) with wait' ],
		[ "CALL pgjq.await(ARRAY['q'], '1 s')", 'await()' ],
		[ "SELECT * FROM pgjq.claim('lim')", 'claim from a queue with a limit' ],
		[ "SELECT pgjq.enqueue('q')", 'enqueue into a ring queue' ],
		[ "SELECT * FROM pgjq.claim('q')", 'claim from a ring queue' ],
		[ "SELECT pgjq.cancel($ready_ring)", 'cancel of a ready ring job' ],
		# the outcomes of ring jobs running since before the restart (their
		# in-flight entries are in shared memory; job(id) shows them running)
		[ "SELECT pgjq.complete($rid[0], $rtok[0])", 'complete of a running ring job' ],
		[ "SELECT pgjq.heartbeat($rid[1], $rtok[1])", 'heartbeat of a running ring job' ],
		[ "SELECT pgjq.fail($rid[2], $rtok[2], 'boom')", 'fail of a running ring job' ],
		[ "SELECT pgjq.snooze($rid[3], $rtok[3], '0 s')", 'snooze of a running ring job' ],
		[ "SELECT pgjq.cancel($rid[4])", 'cancel of a running ring job' ],
	);
	for my $c (@cases)
	{
		($ret, $out, $err) = $node->psql('postgres', $c->[0],
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		like($err, qr/55000/,
			"without shared_preload_libraries: $c->[1] raises 55000")
		  or diag "$c->[0] returned '$out'";
		like($err, qr/HINT:.*shared_preload_libraries/,
			"... with a hint naming shared_preload_libraries");
	}
	is( $node->safe_psql('postgres',
			"SELECT string_agg(j.state, ',' ORDER BY i.id) FROM unnest(ARRAY["
			  . join(',', @rid, $ready_ring) . "]::bigint[]) i(id), LATERAL pgjq.job(i.id) j"),
		'running,running,running,running,running,ready',
		'... and the ring jobs are as they were: five running, one ready');
	($ret, $out, $err) = $node->psql('postgres',
		"SELECT count(*) FILTER (WHERE held_back IS NULL) = count(*) FROM pgjq.queue_stats");
	is($out, 't', 'queue_stats.held_back is NULL without the preload') or diag $err;
	# removing a limit (0) needs no shared memory
	($ret, $out, $err) = $node->psql('postgres',
		"SELECT pgjq.alter_queue('lim', concurrency => 0); SELECT concurrency IS NULL FROM pgjq.queue_stats WHERE queue = 'lim'");
	is($out, "\nt", 'a limit is removed without the preload') or diag $err;
}

$node->stop;
done_testing();
