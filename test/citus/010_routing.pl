# Copyright (c) pgjq contributors
#
# pgjq on Citus (README, "Beyond one server (Citus)"): citus_setup(), calls
# through the coordinator delegated to the node that serves the queue, the
# same calls straight on that node, the queue-first forms, the guard's
# errors on a node that does not serve a queue or an id, ids that name their
# node, an enqueue atomic with the application's colocated rows (and refused
# whole across nodes), two-phase commit for pgjq's local writes next to a
# remote write, and the rebalance strategy that keeps routing shards put.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqCitus;

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
my ($p1, $p2) = map { $c->node_port($_) } 1, 2;


# ------------------------------------------------------------- setup

$c->fails_with(1, 'SELECT * FROM pgjq.citus_setup()', '55000', qr/runs on the coordinator/,
	'citus_setup() on a worker');
$c->fails_with(0, 'SELECT * FROM pgjq.citus_setup(0)', '22023', qr/shard_count must be between 1 and 64000/,
	'citus_setup(0)');
$c->fails_with(0, q{SELECT * FROM pgjq.route('qa')}, '55000', qr/route\(\) needs pgjq on Citus/,
	'route() before citus_setup()');

my $setup = $c->safe_psql(0, 'SELECT group_id, result FROM pgjq.citus_setup(8)');
is($setup, "0|group 0: ids from 281474976710656\n1|group 1: ids from 562949953421312\n"
	  . "2|group 2: ids from 844424930131968",
	'citus_setup(): every node gets its id range');
is($c->safe_psql(0, 'SELECT group_id FROM pgjq.citus_setup(8)'), "0\n1\n2", 'citus_setup() again: idempotent');
is( $c->safe_psql(0,
		q{SELECT count(*) FILTER (WHERE force_delegation), count(*) FROM pg_dist_object
		   WHERE classid = 'pg_proc'::regclass AND objid::regproc::text LIKE 'pgjq.%'}),
	'20|20',
	'the queue-first functions are delegated by their queue, with force_delegation');

# Two queues: one served by each worker (with 8 shards, as in the spike).
$c->safe_psql(0, q{SELECT pgjq.create_queue('qa', lease => '30 seconds'); SELECT pgjq.create_queue('qf');});
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('qa')}), $p1, 'route(): qa is served by worker 1');
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('qf')}), $p2, 'route(): qf is served by worker 2');
is($c->safe_psql(2, q{SELECT node_port FROM pgjq.route('qa')}), $p1, 'route() on another node: the same answer');
is( join(' ', map { $c->safe_psql($_, q{SELECT string_agg(queue, ',' ORDER BY queue) FROM pgjq.queue_stats}) } 0, 1, 2),
	' qa qf', 'each queue exists on its node only');

# ---------------------------------------- through the coordinator, delegated

my $ids = $c->safe_psql(0,
	q{SELECT string_agg(x::text, ',') FROM pgjq.enqueue_many('qa', array['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[]) x});
my @ids = split /,/, $ids;
is(scalar(@ids), 4, 'enqueue_many through the coordinator');
ok((!grep { ($_ >> 48) != 2 } @ids), 'the ids name worker 1 (group 1 + 1 in the high bits)');
my $job = $c->safe_psql(0, q{SELECT pgjq.enqueue('qf', '{"n": 5}')});
is($job >> 48, 3, 'an id of worker 2 names group 2');

my $claimed = $c->safe_psql(0, q{SELECT string_agg(id || ':' || token, ',' ORDER BY id) FROM pgjq.claim('qa', 4)});
my %tok = map { split /:/ } split /,/, $claimed;
is(scalar(keys %tok), 4, 'claim through the coordinator');
my ($a1, $a2, $a3, $a4) = sort { $a <=> $b } keys %tok;
is($c->safe_psql(0, "SELECT pgjq.complete_in('qa', '{$a1}', '{$tok{$a1}}')"), 1, 'complete_in through the coordinator');
is($c->safe_psql(0, "SELECT pgjq.complete_in('qa', '{$a1}', '{$tok{$a1}}')"), 0, 'complete_in again: stale');
is($c->safe_psql(0, "SELECT pgjq.complete_in('qa', '{$a2}', '{1}')"), 0, 'complete_in with a wrong token: stale');
like($c->safe_psql(0, "SELECT pgjq.heartbeat_in('qa', $a2, $tok{$a2}, '1 minute')"), qr/^\d{4}-/, 'heartbeat_in');
is($c->safe_psql(0, "SELECT pgjq.fail_in('qa', $a2, $tok{$a2}, 'boom', retry_in => '0')"), 'retry', 'fail_in');
is($c->safe_psql(0, "SELECT pgjq.snooze_in('qa', $a3, $tok{$a3}, '1 hour')"), 't', 'snooze_in');
is($c->safe_psql(0, "SELECT pgjq.cancel_in('qa', '{$a4}')"), 1, 'cancel_in (a running job: asked to stop)');
is($c->safe_psql(0, "SELECT state FROM pgjq.job_in('qa', $a1)"), 'completed', 'job_in');
is($c->safe_psql(0, "SELECT state || ' ' || attempt FROM pgjq.job_in('qa', $a3)"), 'scheduled 0', 'job_in: the snoozed job (snooze spends no attempt)');

# -------------------------------------------------- straight on the owner

is($c->safe_psql(1, "SELECT state FROM pgjq.job($a1)"), 'completed', 'job(id) on the node that issued it');
my $again = $c->safe_psql(1, q{SELECT id || ':' || token FROM pgjq.claim('qa')});
my ($rid, $rtok) = split /:/, $again;
is($rid, $a2, 'claim straight on worker 1: the retried job');
is($c->safe_psql(1, "SELECT pgjq.complete($rid, $rtok)"), 't', 'complete(id, token) on the node that issued the id');

# ------------------------------------------------------------- the guard

my $fj = $c->safe_psql(0, q{SELECT id || ':' || token FROM pgjq.claim('qf')});
my ($fid, $ftok) = split /:/, $fj;
$c->fails_with(0, "SELECT pgjq.complete($fid, $ftok)", 'PJ001',
	qr/job $fid was issued by node 127\.0\.0\.1:$p2, not by this one/,
	'complete(id, token) on the coordinator (never a silent stale)');
$c->fails_with(1, "SELECT pgjq.heartbeat($fid, $ftok)", 'PJ001', qr/issued by node 127\.0\.0\.1:$p2/,
	'heartbeat(id, token) on the other worker');
$c->fails_with(0, "SELECT * FROM pgjq.job($fid)", 'PJ001', qr/issued by node 127\.0\.0\.1:$p2/,
	'job(id) on the coordinator');
$c->fails_with(1, "SELECT pgjq.cancel_many('{$fid}')", 'PJ001', qr/issued by node/, 'cancel_many on another node');
$c->fails_with(1, "SELECT * FROM pgjq.wait_jobs('{$fid}', '0')", 'PJ001', qr/issued by node/, 'wait_jobs on another node');
$c->fails_with(0, q{DO $$ BEGIN PERFORM pgjq.enqueue('qa', '{}'); END $$},
	'PJ001', qr/queue "qa" is served by node 127\.0\.0\.1:$p1, not by this one/,
	'PERFORM enqueue on the coordinator (not delegated)');
$c->fails_with(0, q{SELECT pgjq.enqueue('qa', jsonb_build_object('at', clock_timestamp()))},
	'PJ001', qr/queue "qa" is served by node 127\.0\.0\.1:$p1/, 'a volatile argument (not delegated)');
$c->fails_with(2, q{SELECT count(*) FROM pgjq.claim('qa', (random() * 0 + 1)::integer)}, 'PJ001',
	qr/served by node 127\.0\.0\.1:$p1/, 'a volatile argument on the other worker (not delegated)');
$c->fails_with(0, q{DO $$ BEGIN PERFORM pgjq.create_queue('qa'); END $$}, 'PJ001', qr/served by node/,
	'create_queue not delegated: no shadow queue on the coordinator');
$c->fails_with(2, q{DO $$ BEGIN PERFORM pgjq.complete_in('qa', '{1}', '{1}'); END $$}, 'PJ001',
	qr/served by node 127\.0\.0\.1:$p1/, 'complete_in not delegated');
is($c->safe_psql(0, "SELECT pgjq.complete_in('qf', '{$fid}', '{$ftok}')"), 1,
	'the same outcome in its queue-first form: completed');
is($c->safe_psql(0, q{SELECT count(*) FROM pgjq.queue}), 0, 'the coordinator still has no queue');

# ---------------------------------------------------------- transactions

$c->safe_psql(0, q{
CREATE TABLE app_order (queue text NOT NULL, id bigint NOT NULL, body text, PRIMARY KEY (queue, id));
SELECT create_distributed_table('app_order', 'queue', colocate_with := 'pgjq.queue_route');
});
my $before = $c->safe_psql(1, q{SELECT ready FROM pgjq.queue_stats WHERE queue = 'qa'});
$c->safe_psql(0, q{
BEGIN;
INSERT INTO app_order VALUES ('qa', 1, 'first');
SELECT pgjq.enqueue('qa', '{"order": 1}');
COMMIT;
});
is($c->safe_psql(0, q{SELECT count(*) FROM app_order WHERE id = 1}), 1, 'same node: the app row committed');
is($c->safe_psql(1, q{SELECT ready FROM pgjq.queue_stats WHERE queue = 'qa'}), $before + 1, 'same node: with its job');
$c->safe_psql(0, q{
BEGIN;
INSERT INTO app_order VALUES ('qa', 2, 'second');
SELECT pgjq.enqueue('qa', '{"order": 2}');
ROLLBACK;
});
is($c->safe_psql(0, q{SELECT count(*) FROM app_order WHERE id = 2}) . ' '
	  . $c->safe_psql(1, q{SELECT ready FROM pgjq.queue_stats WHERE queue = 'qa'}),
	'0 ' . ($before + 1), 'same node, rolled back: neither');

$c->fails_with(0, q{
BEGIN;
INSERT INTO app_order VALUES ('qf', 3, 'third');
SELECT pgjq.enqueue('qa', '{"order": 3}');
COMMIT;
}, '0A000', qr/cannot PREPARE a transaction/, 'app row on worker 2, job on worker 1');
is($c->safe_psql(0, q{SELECT count(*) FROM app_order WHERE id = 3}) . ' '
	  . $c->safe_psql(1, q{SELECT ready FROM pgjq.queue_stats WHERE queue = 'qa'}),
	'0 ' . ($before + 1), 'across nodes: refused whole, neither the row nor the job');
is(join(' ', map { $c->safe_psql($_, 'SELECT count(*) FROM pg_prepared_xacts') } 1, 2), '0 0',
	'nothing left prepared');

# Connected to worker 2: a local pgjq write (qf is served here) and a remote
# write (the app row of qa, on worker 1).  Citus does not see pgjq's write;
# pgjq asks it for two-phase commit, so worker 1 is prepared first.
my ($rc, $out, $err) = $c->psql(2, q{
SET citus.log_remote_commands = on;
BEGIN;
SELECT pgjq.enqueue('qf', '{"order": 4}');
INSERT INTO app_order VALUES ('qa', 4, 'fourth');
COMMIT;
});
is($rc, 0, 'local enqueue plus a remote write: committed');
like($err, qr/PREPARE TRANSACTION/, 'the remote write was prepared (two-phase commit)') or diag $err;
like($err, qr/COMMIT PREPARED/, 'and committed after the local commit') or diag $err;
($rc, $out, $err) = $c->psql(2, q{
SET citus.log_remote_commands = on;
BEGIN;
SELECT 1;
INSERT INTO app_order VALUES ('qa', 5, 'fifth');
COMMIT;
});
unlike($err, qr/PREPARE TRANSACTION/, 'without a pgjq write the same transaction commits in one phase');
is($c->safe_psql(0, q{SELECT string_agg(id::text, ',' ORDER BY id) FROM app_order}), '1,4,5', 'the app rows');

# ------------------------------------------------- rebalancing keeps queues

is($c->safe_psql(0, q{SELECT name FROM pg_dist_rebalance_strategy WHERE default_strategy}),
	'pgjq_keeps_queues', 'citus_setup() made the default rebalance strategy keep routing shards put');
my $qa_shard = $c->safe_psql(0, q{SELECT shard FROM pgjq.route('qa')});
is( $c->safe_psql(0,
		"SELECT pgjq.routing_shard_allowed_on_node($qa_shard, nodeid) FROM pg_dist_node WHERE nodeport = $p2"),
	'f', 'a routing shard may not go to another node');
$c->safe_psql(0, "SELECT citus_set_node_property('127.0.0.1', $p2, 'shouldhaveshards', false)");
is( $c->safe_psql(0,
		q{SELECT count(*) FROM get_rebalance_table_shards_plan(drain_only := true, rebalance_strategy := 'by_shard_count')}),
	8, "draining worker 2 with Citus's by_shard_count would move its 8 shards (routing and app)");
is($c->safe_psql(0, q{SELECT count(*) FROM get_rebalance_table_shards_plan(drain_only := true)}),
	0, "with pgjq's default strategy: none of them");
$c->safe_psql(0, "SELECT citus_set_node_property('127.0.0.1', $p2, 'shouldhaveshards', true)");

# ------------------------------------ a Citus move behind pgjq's back is loud

# A long-lived session on worker 1 (a pooled connection): the guard caches
# where qa is served; Citus's placement change must reach that cache.
my $pooled = $c->node(1)->background_psql('postgres', on_error_stop => 0);
# What the claims below get does not matter, only that they ran (a count of
# jobs came back) or were refused (review 0.4.0, T4: this read like the
# tautology count(*) >= 0).  The claim stays the whole FROM clause: Citus
# delegates SELECT ... FROM f(...), not f in a subquery.
my $not_delegated = q{SELECT count(*) FROM pgjq.claim('qa', (random() * 0 + 1)::integer);};
like($pooled->query($not_delegated), qr/^\d+$/, 'a long-lived session on worker 1 serves qa');
$c->safe_psql(0,
	"SELECT citus_move_shard_placement($qa_shard, '127.0.0.1', $p1, '127.0.0.1', $p2, shard_transfer_mode := 'block_writes')");
$pooled->query($not_delegated);
like($pooled->{stderr}, qr/PJ001|queue "qa" is served by node 127\.0\.0\.1:$p2/,
	'after a Citus move, the same session refuses qa (its cache followed the move)');
$c->fails_with(1, q{SELECT count(*) FROM pgjq.claim('qa', (random() * 0 + 1)::integer)}, 'PJ001',
	qr/queue "qa" is served by node 127\.0\.0\.1:$p2/,
	'after a Citus move, the old node refuses the queue (the guard saw the move)');
my $lost = $c->fails_with(0, q{SELECT count(*) FROM pgjq.claim('qa')}, '42704', qr/queue "qa" does not exist/,
	'after a Citus move, delegated calls fail on the new node (never served from an empty copy)');
like($lost, qr/Citus moved the shard here without pgjq\.move_queues\(\)/, 'saying why it may be so');
$c->safe_psql(0,
	"SELECT citus_move_shard_placement($qa_shard, '127.0.0.1', $p2, '127.0.0.1', $p1, shard_transfer_mode := 'block_writes')");
like($c->safe_psql(0, q{SELECT count(*) FROM pgjq.claim('qa')}), qr/^\d+$/, 'moved back: served again');
like($pooled->query($not_delegated), qr/^\d+$/, 'and the long-lived session serves it again');
$pooled->quit;

$c->stop;
done_testing();
