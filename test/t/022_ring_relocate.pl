
# Copyright (c) pgjq contributors
#
# Relocation of a ring slot's stragglers (a slow tenant's ready job, a job
# running for a day) across crashes, and by the background worker.
#
# - a crash inside the relocation, before it commits: nothing changed, the
#   old slot still holds both jobs;
# - a crash at its commit (after the commit record, before shared memory
#   follows): the rebuild finds each job twice and takes the copy in the
#   newer slot, so the old slots are truncated after the restart;
# - a crash after the truncation: only the copies are left, the ring order
#   is found without being misled by their old ids, the running job keeps
#   its token and lease (not handed out again), the ready one is claimed;
# - with the worker serving the database, it copies and truncates by
#   itself.
# verify() finds shared memory and the tables in agreement after each step.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('ring_relocate');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_slot_rows = 4
pgjq.max_sleep = '1s'
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres',
	"CREATE EXTENSION pgjq; SELECT pgjq.create_queue('rl'); SELECT pgjq.create_queue('rl_slow')");

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub slots_with_bodies
{
	return sql(
		q{SELECT count(*) FILTER (WHERE pg_relation_size(c.oid) > 0) FROM pg_class c
		   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relname LIKE 'ring\_body\__'});
}

my $drain = "SELECT count(*) FROM pgjq.claim('rl', 10) c, pgjq.complete(c.id, c.token) ok";

# The oldest of four slots in use holds the slow job and the long one, the
# rest of its jobs finished.  Returns (slow id, long id, its token, its lease)
# and, with stall(1), the id and token of a job left running in the second.
sub stall
{
	sql("SELECT count(*) FROM pgjq.enqueue_many('rl', array_fill('{}'::jsonb, ARRAY[4]))");
	sql($drain);
	sql('SELECT pgjq._ring_reclaim()') for 1 .. 3;
	is(slots_with_bodies(), '1', 'start: one slot in use');
	my $slow = sql(q{SELECT pgjq.enqueue('rl_slow', '{"n": "slow"}')});
	sql("SELECT count(*) FROM pgjq.enqueue_many('rl', array_fill('{}'::jsonb, ARRAY[7]))");
	my ($long, $tok, $lease) = split /\|/,
	  sql("SELECT id, token, lease_until FROM pgjq.claim('rl', 1, lease => '1 day')");
	sql($drain);
	my $second = '';
	for my $round (1 .. 4)
	{
		sql("SELECT count(*) FROM pgjq.enqueue_many('rl', array_fill('{}'::jsonb, ARRAY[4]))");
		# with $keep2, the second slot keeps a running job too
		$second = sql("SELECT id || ' ' || token FROM pgjq.claim('rl', 1, lease => '1 day')")
		  if $round == 1 && $_[0];
		sql($drain);
	}
	is(slots_with_bodies(), '4', 'stalled: all four slots in use');
	return ($slow, $long, $tok, $lease, split(/ /, $second));
}

# Both jobs as they were: the long one running with its lease, the slow
# one ready; no other job of rl is ready (the long one is not handed out).
sub states_ok
{
	my ($slow, $long, $lease, $what) = @_;
	is(sql("SELECT state || ' ' || lease_until FROM pgjq.job($long)"),
		"running $lease", "$what: the long job runs, with its lease");
	is(sql("SELECT state FROM pgjq.job($slow)"), 'ready', "$what: the slow job is ready");
	is(sql("SELECT count(*) FROM pgjq.claim('rl', 10)"), '0',
		"$what: the running job is not handed out");
	verify_ok($node, 'postgres', $what);
}

my ($slow, $long, $tok, $lease) = stall();

# ------------------------------------------- a crash inside the relocation
crash_at($node, 'ring_relocate', 'SELECT pgjq._ring_reclaim()', 'inside the relocation');
states_ok($slow, $long, $lease, 'after a crash inside the relocation');
is(slots_with_bodies(), '4', 'after a crash inside the relocation: no slot truncated');

# ------------------------------------------------------ a crash at its commit
crash_at($node, 'commit', 'SELECT pgjq._ring_reclaim()', 'at the relocation\'s commit');
states_ok($slow, $long, $lease, 'after a crash at the relocation\'s commit');
# (claims truncate too, one slot per transaction)
sql('SELECT pgjq._ring_reclaim()') for 1 .. 3;
is(slots_with_bodies(), '1', 'after it, the three old slots are truncated');

# ---------------------------------------------- a crash after the truncation
$node->stop('immediate');
$node->start;
states_ok($slow, $long, $lease, 'after a crash with only the copies left');
sql("SELECT count(*) FROM pgjq.enqueue_many('rl', array_fill('{}'::jsonb, ARRAY[6]))");
is(sql($drain), '6', 'new jobs go on after the copies');
verify_ok($node, 'postgres', 'new jobs after the restart');
is(sql("SELECT payload->>'n' FROM pgjq.claim('rl_slow', 10) c, pgjq.complete(c.id, c.token)"),
	'slow', 'the slow job is claimed and completed');
is(sql("SELECT pgjq.complete($long, $tok)"), 't', 'the long job completes with its token');
is(sql("SELECT pgjq.complete($long, $tok)"), 'f', 'once');
verify_ok($node, 'postgres', 'at the end of the crash cases');

# ------------------------- a crash with the copies in a slot between others
# The copies (with the oldest ids) land in the newest slot; once producers
# move on and all four slots are in use again, the rebuild must still find
# the ring order from the ids of the slots' own jobs.
my ($id2, $tok2);
($slow, $long, $tok, $lease, $id2, $tok2) = stall(1);
is(sql('SELECT pgjq._ring_reclaim()'), '2', 'the two stragglers of the oldest slot are copied');
is(sql('SELECT pgjq._ring_reclaim()'), '1', 'the oldest slot is truncated');
is(sql('SELECT pgjq._ring_reclaim()'), '0', 'the next one keeps its running job');
sql("SELECT count(*) FROM pgjq.enqueue_many('rl', array_fill('{}'::jsonb, ARRAY[4]))");
is(sql($drain), '4', 'producers move on to the truncated slot');
is(slots_with_bodies(), '4', 'all four slots in use, the copies in the third');
$node->stop('immediate');
$node->start;
verify_ok($node, 'postgres', 'after a crash with the copies between other slots');
is(sql("SELECT pgjq.complete($id2, $tok2)"), 't', 'the second slot\'s job completes');
is(sql('SELECT pgjq._ring_reclaim()'), '1', 'the second slot is truncated (the oldest)');
is(sql('SELECT pgjq._ring_reclaim()'), '1', 'then the third');
is(sql('SELECT pgjq._ring_reclaim()'), '0', 'the slot with the copies stays');
is(slots_with_bodies(), '2', 'two slots in use');
states_ok($slow, $long, $lease, 'after a crash with the copies between other slots');
is(sql("SELECT pgjq.complete($long, $tok)"), 't', 'the long job completes with its token');
is(sql("SELECT count(*) FROM pgjq.claim('rl_slow', 10) c, pgjq.complete(c.id, c.token)"),
	'1', 'the slow job is claimed and completed');

# ------------------------------------------------------------- the worker
# The stall is made first, then the worker starts serving the database: it
# must copy the stragglers forward and truncate the three old slots by
# itself.  (With the worker serving during the stall, the producer that finds
# the ring full wakes it, and how many slots the later rounds fill after its
# relocation depends on timing.)
($slow, $long, $tok, $lease) = stall(0);
$node->append_conf('postgresql.conf', "pgjq.database_names = 'postgres'");
$node->reload;
ok( $node->poll_query_until('postgres', q{SELECT count(*) FILTER (WHERE pg_relation_size(c.oid) > 0)
		  FROM pg_class c WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relname LIKE 'ring\_body\__'},
		'1'),
	'the worker relocates the stragglers and truncates the old slots');
states_ok($slow, $long, $lease, 'after the worker');
is(sql("SELECT pgjq.complete($long, $tok)"), 't', 'the long job completes with its token');

$node->stop;
done_testing();
