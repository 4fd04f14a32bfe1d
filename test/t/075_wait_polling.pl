# Copyright (c) pgjq contributors
#
# Waiting sleeps; it does not poll (issue 8, review M3 and M4):
#
# - a waiting claim on an empty rate-limited queue, with a batch larger than
#   the bucket, tries a few times over its wait, not once per token;
# - a waiting claim whose claim the bucket did cut still wakes for the next
#   token, and gets the job;
# - CALL await() does not return while every ready job belongs to a key at
#   its key_concurrency, and returns when the running job of that key
#   completes (or at once when another key has a ready job);
# - CALL await() on a queue whose bucket is empty sleeps until the next
#   token instead of returning at once.
#
# Attempts are counted, not timed: each attempt of a waiting claim and each
# check of await() sends a DEBUG1 message, which the tests receive with
# client_min_messages = debug1 and count.  Where time is asserted, it is a
# lower bound that a correct implementation cannot miss (a token is not due
# sooner, a wait does not end sooner), or a generous upper bound.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('wait_polling');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.max_wait = '2min'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgjq');

my $claim_attempt = qr/pgjq: attempt \d+ of a waiting claim/;
my $await_check = qr/pgjq: check \d+ of await/;

# Run $sql with DEBUG1 messages sent to the client.  Returns how long it
# took, its output and how many messages matched $re.
sub run_counting
{
	my ($sql, $re, $name) = @_;
	my $t0 = time();
	my ($ret, $out, $err) =
	  $node->psql('postgres', "SET client_min_messages = debug1;\n$sql");
	my $took = time() - $t0;
	is($ret, 0, "$name: runs without error") or diag $err;
	my $n = () = $err =~ /$re/g;
	note "$name: took $took s, $n counted";
	return ($took, $out, $n);
}

# ============================================ M3: rate limit, empty queue

{
	$node->safe_psql('postgres', "SELECT pgjq.create_queue('r', rate => 5)");
	my ($took, $out, $n) = run_counting(
		"SELECT count(*) FROM pgjq.claim('r', 10, wait => '3 s')",
		$claim_attempt, 'empty rate-limited queue, batch 10 > burst 5');
	is($out, '0', '... the claim gets nothing');
	cmp_ok($took, '>=', 2.9, '... after its wait');
	cmp_ok($n, '>=', 1, '... its attempts are counted');
	cmp_ok($n, '<=', 4,
		'... and it tries a few times, not once per token (5 a second)');
}

{
	# the bucket cut the claim: a token is what the claim waits for
	$node->safe_psql('postgres',
		"SELECT pgjq.create_queue('r1', rate => 2, burst => 1);"
		  . " SELECT count(*) FROM pgjq.enqueue_many('r1', array_fill('{}'::jsonb, ARRAY[2]));"
		  . " SELECT count(*) FROM pgjq.claim('r1')");
	my ($took, $out, $n) = run_counting(
		"SELECT count(*) FROM pgjq.claim('r1', wait => '60 s')",
		$claim_attempt, 'rate-limited queue with a ready job, bucket empty');
	is($out, '1', '... the claim gets the job');
	cmp_ok($took, '<', 20, '... when the next token is due, not at the end of its wait');
	cmp_ok($n, '<=', 4, '... in a few attempts');
}

# ================================================ M4: await and key limits

# A waiting statement in a background session: start it, return once the
# backend sleeps (wait_event "Extension" on PostgreSQL 15, "PgjqClaim" or "PgjqWaitJobs" on 18).
sub start_waiting
{
	my ($sql) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	$s->{stdin} .= "$sql;\n\\echo 'end of waiter'\n";
	$s->{run}->pump_nb();
	ok( $node->poll_query_until(
			'postgres',
			"SELECT wait_event_type = 'Extension' AND wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs')
			   FROM pg_stat_activity WHERE pid = $pid"),
		'the backend sleeps');
	return { s => $s, pid => $pid };
}

sub still_waiting
{
	my ($w) = @_;
	$w->{s}{run}->pump_nb();
	return 0 if $w->{s}{stdout} =~ /end of waiter/;
	return $node->safe_psql('postgres',
		"SELECT wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs') FROM pg_stat_activity WHERE pid = $w->{pid}"
	) eq 't';
}

sub finish
{
	my ($w) = @_;
	my $s = $w->{s};
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/end of waiter\n/)
	  or die "waiter $w->{pid} did not finish";
	my $at = time();
	$s->quit;
	return $at;
}

{
	$node->safe_psql('postgres',
		"SELECT pgjq.create_queue('k', key_concurrency => 1, lease => '1 hour');"
		  . " SELECT count(*) FROM pgjq.enqueue_many('k', array_fill('{}'::jsonb, ARRAY[3]),"
		  . "                                        fair_keys => ARRAY['a', 'a', 'a'])");
	my ($id, $token) = split /,/,
	  $node->safe_psql('postgres', "SELECT id || ',' || token FROM pgjq.claim('k')");
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('k', 5)"),
		'0', 'key_concurrency 1: nothing more to claim while key a runs');

	my ($took, $out, $n) = run_counting("CALL pgjq.await(ARRAY['k'], '2 s')",
		$await_check, 'await, every ready job of a key at its limit');
	cmp_ok($took, '>=', 1.9, '... await() waits to the end of its wait');
	cmp_ok($n, '>=', 1, '... its checks are counted');
	cmp_ok($n, '<=', 3, '... and it checks a few times, it does not spin');

	my $w = start_waiting("CALL pgjq.await(ARRAY['k'], '60 s')");
	usleep(1_500_000);
	ok(still_waiting($w), 'a longer await() keeps sleeping');
	my $t0 = time();
	is($node->safe_psql('postgres', "SELECT pgjq.complete($id, $token)"),
		't', 'the running job of key a completes');
	cmp_ok(finish($w) - $t0, '<', 20, '... and await() returns');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('k', 5)"),
		'1', '... and the next job of key a can be claimed');

	$node->safe_psql('postgres', "SELECT pgjq.enqueue('k', fair_key => 'b')");
	($took, $out, $n) = run_counting("CALL pgjq.await(ARRAY['k'], '60 s')",
		$await_check, 'await, a ready job of another key');
	cmp_ok($took, '<', 20, '... await() returns at once');
}

# ================================================== M4: await and the rate

{
	$node->safe_psql('postgres',
		"SELECT pgjq.create_queue('rr', rate => 0.5, burst => 1);"
		  . " SELECT count(*) FROM pgjq.enqueue_many('rr', array_fill('{}'::jsonb, ARRAY[2]));"
		  . " SELECT count(*) FROM pgjq.claim('rr')");
	my ($took, $out, $n) = run_counting("CALL pgjq.await(ARRAY['rr'], '60 s')",
		$await_check, 'await, a ready job but the bucket empty');
	cmp_ok($took, '>=', 1.0, '... await() sleeps until the next token (due 2 s after the claim)');
	cmp_ok($took, '<', 20, '... and returns then, not at the end of its wait');
	cmp_ok($n, '<=', 4, '... in a few checks');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('rr')"),
		'1', '... and the job can be claimed');
}

$node->stop;
done_testing();
