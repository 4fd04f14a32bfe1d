# Copyright (c) pgjq contributors
#
# The Citus mode's refusals, each with its message: citus_setup() with a
# node's metadata not synced; move_queues() with bad arguments, off the
# coordinator, and when the source does not empty within
# drain_wait (nothing moves, the fence is lifted, the target keeps no
# copy); a move cut short is finished by calling it again.

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


# ------------------------------------------------------------ citus_setup

$c->safe_psql(0, "SELECT stop_metadata_sync_to_node('127.0.0.1', $p2)");
$c->fails_with(0, 'SELECT * FROM pgjq.citus_setup(8)', '55000', qr/metadata sync is off for node 127\.0\.0\.1:$p2/,
	'citus_setup() with a node whose metadata is not synced');
is($c->safe_psql(0, q{SELECT to_regclass('pgjq.queue_route') IS NULL}), 't', 'and nothing was made');
$c->safe_psql(0, "SELECT start_metadata_sync_to_node('127.0.0.1', $p2)");
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');

# a node whose id sequence is past its range (a dump of another node
# restored there): citus_setup() stops, naming it (review 0.4.0 M2, L2)
my $g2 = $c->safe_psql(2, 'SELECT groupid FROM pg_dist_local_group');
$c->safe_psql(2, "ALTER SEQUENCE pgjq.job_id_seq NO MAXVALUE; SELECT setval('pgjq.job_id_seq', (${g2}::bigint + 3) << 48)");
$c->fails_with(0, 'SELECT * FROM pgjq.citus_setup(8)', '55000',
	qr/node 127\.0\.0\.1:$p2 \(group $g2\) could not be given its id range: .*the id sequences of group $g2 are past its range/,
	'citus_setup() with a node whose ids are past its range');
$c->safe_psql(2, "SELECT setval('pgjq.job_id_seq', (${g2}::bigint + 1) << 48, false)");
like($c->safe_psql(0, 'SELECT string_agg(result, \', \') FROM pgjq.citus_setup(8)'), qr/group $g2: ids from/,
	'set back, the setup goes through');

# ------------------------------------------------------------ move_queues

$c->safe_psql(0, q{SELECT pgjq.create_queue('qa', max_attempts => 1)});
my ($shard, $home) = split /\|/, $c->safe_psql(0, q{SELECT shard, node_port FROM pgjq.route('qa')});
my $other = $home == $p1 ? $p2 : $p1;
my $home_n = $home == $p1 ? 1 : 2;

$c->fails_with(1, "CALL pgjq.move_queues($shard, '127.0.0.1', $other)", '55000', qr/move_queues\(\) runs on the coordinator/,
	'move_queues() on a worker');
$c->fails_with(0, "CALL pgjq.move_queues(1, '127.0.0.1', $other)", '22023', qr/shard 1 is not a shard of pgjq\.queue_route/,
	'move_queues() of a shard that is not a routing shard');
$c->fails_with(0, "CALL pgjq.move_queues($shard, '127.0.0.1', 1)", '22023', qr/no active primary node 127\.0\.0\.1:1 in the cluster/,
	'move_queues() to a node that is not in the cluster');
$c->fails_with(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $other, '-1 s')", '22023', qr/drain_wait must not be negative/,
	'move_queues() with a negative drain_wait');

# a periodic job and a dead job no longer stop a move: it carries them
# (050_move_carry.pl); here they stay where they are when a move gives up
$c->safe_psql($home_n, q{SELECT pgjq.schedule('nightly', '0 3 * * *', 'qa')});
my $id = $c->safe_psql(0, q{SELECT pgjq.enqueue('qa', '{}')});
my ($cid, $tok) = split /\|/, $c->safe_psql(0, q{SELECT id, token FROM pgjq.claim('qa')});
is($c->safe_psql(0, "SELECT pgjq.fail_in('qa', $cid, $tok, 'no')"), 'dead', 'a dead job');
is($c->safe_psql(0, q{SELECT pgjq.retry_dead('qa')}), 1, 'redriven');

# a job that does not finish within drain_wait: nothing moves
is($c->safe_psql($home_n, q{SELECT count(*) FROM pgjq.queue_fence}), 0, 'no fence before');
$c->fails_with(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $other, drain_wait => '1 s')", '55006',
	qr/still hold 1 unfinished and 0 dead jobs after 00:00:01: nothing moved/,
	'move_queues() when the source does not empty in time');
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('qa')}), $home, 'the queue is still served where it was');
is($c->safe_psql($home_n, q{SELECT count(*) FROM pgjq.queue_fence}), 0, 'the fence is lifted');
is($c->safe_psql($home_n == 1 ? 2 : 1, q{SELECT count(*) FROM pgjq.queue}), 0, 'the target kept no copy');
like($c->safe_psql(0, q{SELECT pgjq.enqueue('qa', '{}')}), qr/^\d+$/, 'enqueues are taken again');
is($c->safe_psql($home_n, q{SELECT name FROM pgjq.list_schedules()}), 'nightly', 'the schedule stays on the source');
$c->safe_psql($home_n, q{SELECT pgjq.unschedule('nightly')});

# a move cut short after its switch (the source's queues not dropped yet):
# calling it again finishes it
$c->safe_psql(0, q{SELECT pgjq.purge('qa')});
my ($rid, $rtok) = split /\|/, $c->safe_psql(0, q{SELECT id, token FROM pgjq.claim('qa')});
$c->safe_psql(0, "SELECT pgjq.complete_in('qa', '{$rid}', '{$rtok}')");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $other, 'SELECT pgjq._citus_adopt_queues('
	|| quote_literal(pgjq._citus_on('127.0.0.1', $home, 'SELECT pgjq._citus_shard_queues($shard)')) || ')')");
my $other_g = $c->safe_psql(0, "SELECT groupid FROM pg_dist_node WHERE nodeport = $other");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $home, 'SELECT pgjq._citus_fence($shard, $other_g, ''s'')')");
$c->safe_psql(0,
	"SELECT citus_move_shard_placement($shard, '127.0.0.1', $home, '127.0.0.1', $other, shard_transfer_mode := 'block_writes')");
my ($rc, $out, $err) = $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $other)");
is($rc, 0, 'move_queues() again after a switch without its last step');
like($err, qr/its queues on 127\.0\.0\.1:$home are dropped now/, 'it says what it finished');
is($c->safe_psql($home_n, q{SELECT count(*) FROM pgjq.queue}) . ' '
	  . $c->safe_psql($home_n, q{SELECT count(*) FROM pgjq.queue_fence}), '0 0',
	'the source has neither the queue nor the fence');
like($c->safe_psql(0, q{SELECT pgjq.enqueue('qa', '{}')}), qr/^\d+$/, 'the queue is served on its new node');

$c->stop;
done_testing();
