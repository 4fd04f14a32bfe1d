# Copyright (c) pgjq contributors
#
# pgjq on Citus under load: producers and workers through the coordinator,
# and workers straight on the queue's node (found with route()), each call
# recorded in a ledger that is itself distributed and colocated
# with the queue (so the call and its record commit together on one node,
# and move with it).  Under that load the queue moves twice with
# pgjq.move_queues() (there and back), the node serving another queue is
# killed (-9) and restarted, then the node serving the loaded queue.  Then: nothing lost, nothing completed
# twice, no job claimed while an earlier lease of it was valid; producers
# saw only the retryable "moving" error; the killed node's queue failed
# fast while it was down and came back with its jobs.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqCitus;

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
my $tmp = PostgreSQL::Test::Utils::tempdir;
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');
$c->safe_psql(0, q{
SELECT pgjq.create_queue('c', lease => '3 seconds', max_attempts => 1000,
                         backoff_base => '100 milliseconds', backoff_max => '1 second');
CREATE TABLE produced (queue text NOT NULL, id bigint NOT NULL);
CREATE TABLE claimed (queue text NOT NULL, ids bigint[] NOT NULL, tokens bigint[] NOT NULL,
                      lease_until timestamptz, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE done (queue text NOT NULL, ids bigint[] NOT NULL, tokens bigint[] NOT NULL, n bigint NOT NULL);
SELECT create_distributed_table(t, 'queue', colocate_with := 'pgjq.queue_route')
  FROM unnest(array['produced', 'claimed', 'done']) t;
});
my %port = map { $_ => $c->node_port($_) } 0, 1, 2;
my ($home) = $c->safe_psql(0, q{SELECT node_port FROM pgjq.route('c')});
my $other = $home == $port{1} ? $port{2} : $port{1};
my $other_n = $other == $port{1} ? 1 : 2;
# a queue on the other worker
my $qf = $c->safe_psql(0, "SELECT q FROM generate_series(1, 100) i, LATERAL (SELECT 'q' || i AS q) x
	WHERE (SELECT node_port FROM pgjq.route(x.q)) = $other ORDER BY i LIMIT 1");
$c->safe_psql(0, "SELECT pgjq.create_queue('$qf')");
is($c->safe_psql(0, "SELECT node_port FROM pgjq.route('$qf')"), $other, "$qf is served by the other worker");
my $shard = $c->safe_psql(0, q{SELECT shard FROM pgjq.route('c')});

# ------------------------------------------------------------- the load

sub script
{
	my ($name, $text) = @_;
	open my $fh, '>', "$tmp/$name.sql" or die;
	print $fh $text;
	close $fh;
	return "$tmp/$name.sql";
}
# each call and its record in one transaction on the queue's node
my $produce = script('produce', q{BEGIN;
SELECT pgjq.enqueue('c', '{"r": 1}') AS id \gset
INSERT INTO produced VALUES ('c', :id);
COMMIT;
});
my $work = script('work', q{BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens,
       coalesce(max(lease_until)::text, '') AS lease_until FROM pgjq.claim('c', 1) \gset
INSERT INTO claimed (queue, ids, tokens, lease_until) VALUES ('c', ':ids', ':tokens', NULLIF(':lease_until', '')::timestamptz);
COMMIT;
BEGIN;
SELECT pgjq.complete_in('c', ':ids', ':tokens') AS n \gset
INSERT INTO done VALUES ('c', ':ids', ':tokens', :n);
COMMIT;
});
# a worker connected straight to the queue's node: plain complete(ids, tokens)
my $work_direct = script('work_direct', q{BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens,
       coalesce(max(lease_until)::text, '') AS lease_until FROM pgjq.claim('c', 1) \gset
INSERT INTO claimed (queue, ids, tokens, lease_until) VALUES ('c', ':ids', ':tokens', NULLIF(':lease_until', '')::timestamptz);
COMMIT;
BEGIN;
SELECT pgjq.complete(':ids'::bigint[], ':tokens'::bigint[]) AS n \gset
INSERT INTO done VALUES ('c', ':ids', ':tokens', :n);
COMMIT;
});
my $stop = "$tmp/stop";
# the loops end with the test, also when it dies
my $me = $$;
END { if (defined $stop) { open my $f, '>', $stop; close $f; } }
my $pgbench = "pgbench -n -h " . $c->coordinator->host . " -p $port{0} -d postgres -T 3";
# pgbench ends a client at its first error (a move's PJ002, a lost node):
# each loop starts it again until the test says stop
my @bg;
for my $what (["produce", "$pgbench -c 4 -j 2 -f $produce"], ["work", "$pgbench -c 2 -j 2 -f $work"])
{
	my ($name, $cmd) = @$what;
	push @bg, IPC::Run::start(['sh', '-c',
		"while [ ! -f $stop ] && kill -0 $me 2>/dev/null; do $cmd >>$tmp/$name.log 2>&1; sleep 0.1; done"]);
}
# the direct workers ask route() where the queue is before each round, as
# a worker that connects to the queue's node does
my $host = $c->coordinator->host;
push @bg, IPC::Run::start(['sh', '-c', "while [ ! -f $stop ] && kill -0 $me 2>/dev/null; do
	port=\$(psql -XAtq -h $host -p $port{0} -d postgres -c \"SELECT node_port FROM pgjq.route('c')\");
	pgbench -n -h $host -p \$port -d postgres -T 3 -c 2 -j 2 -f $work_direct >>$tmp/work_direct.log 2>&1; sleep 0.1; done"]);
sub count_of { return $c->safe_psql(0, "SELECT count(*) FROM $_[0] WHERE queue = 'c'"); }
sub wait_for_more
{
	my ($table, $what) = @_;
	my $n0 = count_of($table);
	my $t0 = time;
	while (time - $t0 < 60)
	{
		return ok(1, "$what: $table grows (from $n0)") if count_of($table) > $n0 + 50;
		usleep(200_000);
	}
	return ok(0, "$what: $table grows");
}
wait_for_more('produced', 'load started');
wait_for_more('done', 'load started');

# ------------------------------------------------------ two moves under load

my ($rc, $out, $err) = $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $other, drain_wait => '60 s')");
is($rc, 0, 'move_queues under load: done') or diag $err;
like($err, qr/routing shard $shard moved from 127\.0\.0\.1:$home to 127\.0\.0\.1:$other with 1 queues/,
	'move_queues says what it moved');
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('c')}), $other, 'route(): c is served by the other worker now');
is($c->safe_psql($home == $port{1} ? 1 : 2, q{SELECT count(*) FROM pgjq.queue WHERE name = 'c'}), 0,
	'the source dropped its (empty) copy');
wait_for_more('done', 'after the first move');
wait_for_more('produced', 'after the first move');

($rc, $out, $err) = $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $home, drain_wait => '60 s')");
is($rc, 0, 'move_queues back under load: done') or diag $err;
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('c')}), $home, 'route(): c is home again');
wait_for_more('done', 'after the second move');

# --------------------------------------- kill -9 of the node serving qf

$c->safe_psql(0, qq{SELECT count(*) FROM pgjq.enqueue_many('$qf', array['{"k": 1}', '{"k": 2}', '{"k": 3}']::jsonb[])});
$c->psql($other_n, 'SELECT 1');
my $node = $c->node($other_n);
kill 'KILL', $node->{_pid} // (split /\n/, slurp_file($node->data_dir . '/postmaster.pid'))[0];
usleep(300_000);
my $t0 = time;
($rc, $out, $err) = $c->psql(0, qq{SELECT pgjq.enqueue('$qf', '{}')});
my $took = time - $t0;
isnt($rc, 0, "$qf while its node is down: refused");
like($err, qr/connection to the remote node .*:$other failed|terminating connection|could not connect|server closed the connection/,
	'with a clear error naming the node') or diag $err;
ok($took < 10, "and fast ($took s)");
wait_for_more('done', 'while the other node is down, c keeps serving');
# its children exit when they see the postmaster gone; then start it again
$node->{_pid} = undef;
usleep(2_000_000);
ok($c->start_worker($other_n), 'the killed node is back');
my $back;
for (1 .. 100)
{
	($rc, $back) = $c->psql(0, qq{SELECT count(*) FROM pgjq.claim('$qf', 10)});
	last if $rc == 0;
	usleep(200_000);
}
is($back, 3, "$qf\'s jobs came back with its node and are claimed again");

# ------------------------------- kill -9 of the node serving c, under load

my $home_n = $home == $port{1} ? 1 : 2;
my $hnode = $c->node($home_n);
kill 'KILL', (split /\n/, slurp_file($hnode->data_dir . '/postmaster.pid'))[0];
usleep(500_000);
($rc, $out, $err) = $c->psql(0, q{SELECT pgjq.enqueue('c', '{}')});
isnt($rc, 0, 'c while its node is down: refused');
like($err, qr/connection to the remote node .*:$home failed|terminating connection|could not connect|server closed the connection/,
	'with a clear error naming the node') or diag $err;
$hnode->{_pid} = undef;
usleep(2_000_000);
ok($c->start_worker($home_n), "c's node is back");
wait_for_more('done', "after c's node came back");
wait_for_more('produced', "after c's node came back");

# ------------------------------------------------------------- the ledger

open my $fh, '>', $stop or die;
close $fh;
$_->finish for @bg;
my $produced = count_of('produced');
ok($produced > 100, "$produced jobs produced");
# drain: workers only, until every produced job is done
for (1 .. 600)
{
	last if $c->safe_psql(0, q{SELECT count(*) FROM produced p WHERE queue = 'c' AND NOT EXISTS
		(SELECT 1 FROM done d WHERE d.queue = 'c' AND d.ids = ARRAY[p.id] AND d.n = 1)}) == 0;
	system("pgbench -n -h " . $c->coordinator->host . " -p $port{0} -d postgres -c 4 -j 2 -T 2 -f $work >>$tmp/drain.log 2>&1");
	usleep(100_000);
}
my $q = sub { $c->safe_psql(0, $_[0]) };
# workers claim one job at a time, so each done row acknowledges exactly
# its job (n = 1) or records a stale token (n = 0: its lease had run out)
is( $q->(q{SELECT count(*) FROM produced p WHERE queue = 'c' AND NOT EXISTS
	(SELECT 1 FROM done d WHERE d.queue = 'c' AND d.ids = ARRAY[p.id] AND d.n = 1)}),
	0, 'nothing lost: every produced job completed');
# a job only with its ledger row: the enqueue and its record committed
# together, also when the switch caught a transaction (refused whole)
is( $q->(q{SELECT count(*) FROM (SELECT DISTINCT u.id FROM claimed c, unnest(c.ids) u(id) WHERE c.queue = 'c') x
	WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.queue = 'c' AND p.id = x.id)}),
	0, 'no job without its producer\'s ledger row');
is( $q->(q{SELECT count(*) FROM (SELECT u.id FROM done d, unnest(d.ids) u(id)
	WHERE d.queue = 'c' AND d.n = cardinality(d.ids) GROUP BY u.id HAVING count(*) > 1) x}),
	0, 'nothing completed twice');
is( $q->(q{SELECT count(*) FROM done d WHERE queue = 'c' AND d.n < cardinality(d.ids)}) <= 
	$q->(q{SELECT count(*) FROM done WHERE queue = 'c'}) / 10, 1, 'stale completions are rare');
is( $q->(q{WITH cl AS (SELECT u.id, c.lease_until, c.at FROM claimed c, unnest(c.ids) u(id) WHERE c.queue = 'c')
	SELECT count(*) FROM cl a JOIN cl b ON a.id = b.id AND b.at > a.at
	 WHERE b.lease_until - interval '3 seconds' < a.lease_until - interval '10 milliseconds'}),
	0, 'no job claimed while an earlier lease of it was valid');
my $plog = slurp_file("$tmp/produce.log");
my @errs = $plog =~ /ERROR:\s+([^\n]*)/g;
# around the switch a producer's transaction was seen refused whole at
# COMMIT (its two statements reached two nodes; pgjq refuses PREPARE): a
# clean refusal, checked above to leave no job without its row
# and while c's node was down, the connection errors that say so
my $down = qr/connection to the remote node|could not commit transaction for shard|terminating connection|server closed the connection|could not connect|the database system is (?:starting up|shutting down|in recovery mode)/;
my @other = grep { !/is moving to another node|cannot PREPARE a transaction/ && !/$down/ } @errs;
note scalar(@errs) . " producer errors, " . scalar(@other) . " other than 'moving' or refused whole";
is(scalar(@other), 0, "producers saw only 'moving', a refusal of the whole transaction, or the node down")
  or diag join("\n", grep { defined } @other[0 .. 4]);
is($q->(q{SELECT count(*) FROM pg_prepared_xacts}), 0, 'nothing left prepared on the coordinator');
my $dlog = slurp_file("$tmp/work_direct.log");
my $direct = 0;
$direct += $_ for $dlog =~ /number of transactions actually processed: (\d+)/g;
ok($direct > 0, "workers straight on the queue's node ran $direct cycles");
my @derr = grep { !/is moving to another node|is served by node|was issued by node/ && !/$down/ }
  ($dlog =~ /ERROR:\s+([^\n]*)/g);
is(scalar(@derr), 0, "their errors were the guard's (a move) only") or diag join("\n", grep { defined } @derr[0 .. 4]);

$c->stop;
done_testing();
