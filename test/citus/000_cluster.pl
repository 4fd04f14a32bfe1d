# Copyright (c) pgjq contributors
#
# The Citus test cluster itself (test/perl/PgjqCitus.pm): a coordinator and
# two workers come up with Citus and pgjq preloaded, the coordinator reaches
# the workers over TCP, CREATE EXTENSION pgjq on the coordinator reached the
# workers, each node runs its own pgjq worker, and a queue made directly on
# a worker works.  Then the harness's stop/start and kill -9 of a worker.

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

my $expect = join ' ', map { "127.0.0.1:$_" } sort { $a <=> $b } map { $c->node_port($_) } 1, 2;
is( $c->safe_psql(0,
		q{SELECT string_agg(nodename || ':' || nodeport, ' ' ORDER BY nodeport) FROM pg_dist_node WHERE noderole = 'primary' AND isactive AND groupid <> 0}
	),
	$expect,
	'both workers are active nodes at 127.0.0.1');

# The coordinator's own connections to the workers, over TCP.
is( $c->safe_psql(0,
		q{SELECT string_agg(success::text || ':' || result, ' ') FROM run_command_on_workers($$SELECT extname FROM pg_extension WHERE extname = 'pgjq'$$)}
	),
	'true:pgjq true:pgjq',
	'the coordinator reaches both workers, which have pgjq');

for my $n (0 .. 2)
{
	is($c->safe_psql($n, "SELECT extname FROM pg_extension WHERE extname = 'pgjq'"),
		'pgjq', "node $n: pgjq is installed");
	ok( $c->node($n)->poll_query_until('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'",
			'1'),
		"node $n: the pgjq worker runs");
}

# Both preload orders (review 0.4.0 M1): worker 2 loads pgjq before Citus.
is($c->safe_psql(2, 'SHOW shared_preload_libraries'), 'pgjq,citus', 'worker 2 preloads pgjq first, and is up');
is($c->safe_psql(1, 'SHOW shared_preload_libraries'), 'citus,pgjq', 'worker 1 preloads Citus first');

# A queue made directly on worker 1: pgjq there is a server of its own.
sub roundtrip
{
	my ($n, $queue) = @_;
	$c->safe_psql($n, "SELECT pgjq.create_queue('$queue')");
	my $id = $c->safe_psql($n, "SELECT pgjq.enqueue('$queue', '{\"n\": $n}')");
	like($id, qr/^\d+$/, "node $n: enqueue");
	my ($cid, $token, $payload) = split /\|/,
	  $c->safe_psql($n, "SELECT id, token, payload->>'n' FROM pgjq.claim('$queue')");
	is("$cid/$payload", "$id/$n", "node $n: claim gets the job");
	is($c->safe_psql($n, "SELECT pgjq.complete($cid, $token)"), 't', "node $n: complete");
	is($c->safe_psql($n, "SELECT state FROM pgjq.job($id)"), 'completed', "node $n: the job is completed");
	return $id;
}
roundtrip(1, 'on_worker');

# The harness: a worker stopped and started, another killed and restarted,
# each back with its pgjq worker.
$c->stop_worker(1);
ok($c->start_worker(1), 'worker 1: started again, accepts TCP connections');
ok($c->kill9_worker(2), 'worker 2: restarted after kill -9, accepts TCP connections');
for my $n (1, 2)
{
	ok( $c->node($n)->poll_query_until('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'",
			'1'),
		"node $n: the pgjq worker runs again");
}
is($c->safe_psql(0, 'SELECT count(*) FROM run_command_on_workers($$SELECT 1$$) WHERE success'),
	'2', 'the coordinator reaches both workers again');
roundtrip(2, 'after_kill');

$c->stop;
done_testing();
