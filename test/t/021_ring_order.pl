
# Copyright (c) pgjq contributors
#
# The ring's order survives restarts (review of 0.2.0, C1; issue 28).
#
# A promoted body (a delayed job when due, a retry, a snooze) is appended to
# the current slot under its job's old id.  0.2.0's rebuild took the slot
# with the smallest id as the oldest, so with all four slots in use and such
# a body in the current slot it took the slot before it as current; the
# true current slot, holding the log rows of jobs in the other slots (a
# completion, a claim), was then truncated as "the oldest" once its own
# bodies were finished, and the next restart revived the completed job and
# handed the running one out again while its lease was valid.
#
# Here: slot 0 holds L and J (running on leases of a day) and K; slots 1
# and 2 filler jobs, finished; slot 3 current, where K's completion and J's
# claim are logged, and then the delayed job D (the smallest id of all) is
# promoted.  Restart; D is claimed and completed; the worker's space step
# runs; restart again.  K must stay completed, J and L running with their
# tokens, nothing claimable, and verify() must agree at every step.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('ring_order');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_slot_rows = 4
});
$node->start;
$node->safe_psql('postgres',
	"CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q'); SELECT pgjq.create_queue('f')");

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub slots_with_rows
{
	return sql(
		q{SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_class c
		   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relname LIKE 'ring\_body\__'
		     AND pg_relation_size(c.oid) > 0});
}

my $fill =
  "SELECT count(*) FROM pgjq.enqueue_many('f', array_fill('{}'::jsonb, ARRAY[4]))";
my $drain_f = "SELECT count(*) FROM pgjq.claim('f', 10) c, pgjq.complete(c.id, c.token) ok";

# D first: the smallest id, waiting in pgjq.job until it is due
my $d = sql(q{SELECT pgjq.enqueue('q', '{"n": "D"}', delay => '3 s')});
my $due = sql("SELECT run_at FROM pgjq.job($d)");

# slot 0: L, K, J
my ($l, $k, $j) = split /\n/,
  sql(q{SELECT * FROM pgjq.enqueue_many('q', ARRAY['{"n": "L"}', '{"n": "K"}', '{"n": "J"}']::jsonb[])});
my ($l_id, $l_tok) = split /\|/, sql("SELECT id, token FROM pgjq.claim('q', 1, lease => '1 day')");
is($l_id, $l, 'L is claimed first, on a lease of a day');
sql(
	"SELECT count(*) FROM pgjq.enqueue_many('f', array_fill('{}'::jsonb, ARRAY[1]))");    # slot 0 full
sql($drain_f);
# slots 1 and 2: filler jobs, finished (kept: slot 0 is older and in use)
for (1 .. 2) { sql($fill); sql($drain_f); }
# slot 3, current: K's completion and J's claim are logged here
sql($fill);
sql($drain_f);
is(slots_with_rows(), 'ring_body_0 ring_body_1 ring_body_2 ring_body_3', 'all four slots in use');
my ($k_id, $k_tok) = split /\|/, sql("SELECT id, token FROM pgjq.claim('q', 1)");
is($k_id, $k, 'K is claimed');
is(sql("SELECT pgjq.complete($k, $k_tok)"), 't', 'K is completed (its row in slot 3)');
my ($j_id, $j_tok) = split /\|/, sql("SELECT id, token FROM pgjq.claim('q', 1, lease => '1 day')");
is($j_id, $j, 'J is claimed on a lease of a day (its row in slot 3)');

# D falls due and is promoted into slot 3 under its old id
sleep 1 while sql("SELECT now() < '$due'::timestamptz") eq 't';
is(sql('SELECT pgjq.promote()'), '1', 'D is promoted into the ring');
is(sql(q{SELECT count(*) FROM pgjq.ring_body_3 WHERE id = } . $d), '1', 'D is in slot 3');
verify_ok($node, 'postgres', 'before the first restart');

$node->restart;
verify_ok($node, 'postgres', 'after the first restart (the ring order read back)');
my ($d_id, $d_tok) = split /\|/, sql("SELECT id, token FROM pgjq.claim('q', 5)");
is($d_id, $d, 'after the restart D is the one ready job');
is(sql("SELECT pgjq.complete($d, $d_tok)"), 't', 'D is completed');
# the space step of the worker: whatever is truncatable is truncated now
sql('SELECT pgjq._ring_reclaim()') for 1 .. 4;
verify_ok($node, 'postgres', 'after D and the space step');
like(slots_with_rows(), qr/ring_body_3/, 'slot 3 (current) is not truncated');

$node->restart;
verify_ok($node, 'postgres', 'after the second restart');
is(sql("SELECT count(*) FROM pgjq.claim('q', 10)"),
	'0', 'nothing to claim: K stays completed, J and L keep their leases');
is(sql("SELECT state FROM pgjq.job($k)"), 'completed', 'K: completed');
is(sql("SELECT state FROM pgjq.job($j)"), "running", "J: running");
is(sql("SELECT pgjq.complete($j, $j_tok)"), 't', "J's holder completes it with its token");
is(sql("SELECT pgjq.complete($l, $l_tok)"), 't', "L's holder completes it with its token");
is(sql("SELECT completed FROM pgjq.queue_stats WHERE queue = 'q'"), '4',
	'each of D, K, J, L completed once');
verify_ok($node, 'postgres', 'at the end');

# The 'g' rows: one per slot turn with a committed row, generations in ring order
is(sql(
		q{SELECT string_agg(g::text, ' ' ORDER BY s) FROM (
			SELECT 0 s, max(token) g FROM pgjq.ring_log_0 WHERE kind = 'g' UNION ALL
			SELECT 1, max(token) FROM pgjq.ring_log_1 WHERE kind = 'g' UNION ALL
			SELECT 2, max(token) FROM pgjq.ring_log_2 WHERE kind = 'g' UNION ALL
			SELECT 3, max(token) FROM pgjq.ring_log_3 WHERE kind = 'g') x WHERE g IS NOT NULL}),
	'1 2 3 4', 'the slots carry generations 1..4 in ring order');

$node->stop;
done_testing();
