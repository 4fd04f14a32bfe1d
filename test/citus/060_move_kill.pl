# Copyright (c) pgjq contributors
#
# A move resumed after a kill -9 loses nothing (issue 35, "What to build"
# 3; review 0.4.0 C3, M3, T2, T6).  One queue under load: producers
# through the coordinator, a REPEATABLE READ producer straight on the
# queue's node, workers through the coordinator and a worker straight on
# the queue's node that keeps its connection, each call recorded in a
# ledger colocated with the queue (as in 020_load_moves.pl).  First one
# whole move, timed (the window in which producers get PJ002).  Then the
# move is stopped after each of its steps in turn (pgjq.debug_move_stop_after),
# one node is killed -9 and started again (after each step the coordinator,
# the source and the target, each in a round of its own: 15 rounds), and the
# move is called again to finish.  After each:
# the ledger (every acknowledged job completed exactly once, nothing
# lost), no fence left on any node, nothing left prepared on any node,
# verify() clean on every node.

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
use PgjqTest ();

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
my $tmp = PostgreSQL::Test::Utils::tempdir;
my %port = map { $_ => $c->node_port($_) } 0, 1, 2;
my %n_of_port = map { $port{$_} => $_ } 0, 1, 2;
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');
$c->safe_psql(0, q{
SELECT pgjq.create_queue('c', lease => '3 seconds', max_attempts => 1000,
                         backoff_base => '100 milliseconds', backoff_max => '1 second');
CREATE TABLE produced (queue text NOT NULL, id bigint NOT NULL);
CREATE TABLE done (queue text NOT NULL, ids bigint[] NOT NULL, tokens bigint[] NOT NULL, n bigint NOT NULL);
SELECT create_distributed_table(t, 'queue', colocate_with := 'pgjq.queue_route')
  FROM unnest(array['produced', 'done']) t;
});
my $shard = $c->safe_psql(0, q{SELECT shard FROM pgjq.route('c')});
sub home { return $n_of_port{ $c->safe_psql(0, q{SELECT node_port FROM pgjq.route('c')}) }; }

sub script
{
	my ($name, $text) = @_;
	open my $fh, '>', "$tmp/$name.sql" or die;
	print $fh $text;
	close $fh;
	return "$tmp/$name.sql";
}
my $produce = script('produce', q{BEGIN;
SELECT pgjq.enqueue('c', '{"r": 1}') AS id \gset
INSERT INTO produced VALUES ('c', :id);
COMMIT;
});
# its snapshot taken before the enqueue, as an application's transaction
my $produce_rr = script('produce_rr', q{BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM produced WHERE queue = 'c' AND id = 0;
\sleep 5 ms
SELECT pgjq.enqueue('c', '{"rr": 1}') AS id \gset
INSERT INTO produced VALUES ('c', :id);
COMMIT;
});
my $work = script('work', q{SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens
  FROM pgjq.claim('c', 1) \gset
BEGIN;
SELECT pgjq.complete_in('c', ':ids', ':tokens') AS n \gset
INSERT INTO done VALUES ('c', ':ids', ':tokens', :n);
COMMIT;
});
my $work_direct = script('work_direct', q{SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens
  FROM pgjq.claim('c', 1) \gset
BEGIN;
SELECT pgjq.complete(':ids'::bigint[], ':tokens'::bigint[]) AS n \gset
INSERT INTO done VALUES ('c', ':ids', ':tokens', :n);
COMMIT;
});

# the loads: each loop starts its pgbench again after an error (a move's
# PJ002, a node down) until the test says stop
my $host = $c->coordinator->host;
my $me = $$;
my ($stop, @bg);
sub start_load
{
	my ($round) = @_;
	$stop = "$tmp/stop$round";
	my $route = "psql -XAtq -h $host -p $port{0} -d postgres -c \"SELECT node_port FROM pgjq.route('c')\"";
	for my $what (
		[ 'produce', "pgbench -n -h $host -p $port{0} -d postgres -T 2 -c 2 -j 2 -f $produce" ],
		[ 'work', "pgbench -n -h $host -p $port{0} -d postgres -T 2 -c 1 -j 1 -f $work" ],
		[ 'produce_rr', "pgbench -n -h $host -p \$($route) -d postgres -T 2 -c 1 -j 1 -f $produce_rr" ],
		# one connection for 5 s, as a worker that keeps its connection
		[ 'work_direct', "pgbench -n -h $host -p \$($route) -d postgres -T 5 -c 1 -j 1 -f $work_direct" ])
	{
		my ($name, $cmd) = @$what;
		push @bg, IPC::Run::start([ 'sh', '-c',
			"while [ ! -f $stop ] && kill -0 $me 2>/dev/null; do $cmd >>$tmp/$name.log 2>&1; sleep 0.1; done" ]);
	}
	return;
}
sub stop_load
{
	open my $fh, '>', $stop or die;
	close $fh;
	$_->finish for @bg;
	@bg = ();
	return;
}
END { if (defined $stop) { open my $f, '>', $stop; close $f; } }
sub count_of { return $c->safe_psql(0, "SELECT count(*) FROM $_[0] WHERE queue = 'c'"); }
sub wait_for_more
{
	my ($table, $n) = @_;
	my $n0 = count_of($table);
	my $until = time + 30;
	usleep(100_000) while time < $until && count_of($table) < $n0 + $n;
	return count_of($table) >= $n0 + $n;
}

# the ledger, after the load stopped: workers drain the queue, then every
# produced job is completed exactly once, nothing left fenced or prepared,
# verify() clean everywhere
sub check_all
{
	my ($what) = @_;
	for (1 .. 100)
	{
		last if $c->safe_psql(0, q{SELECT count(*) FROM produced p WHERE queue = 'c' AND p.id NOT IN
			(SELECT d.ids[1] FROM done d WHERE d.queue = 'c' AND cardinality(d.ids) = 1 AND d.n = 1)}) == 0;
		system("pgbench -n -h $host -p $port{0} -d postgres -c 2 -j 2 -T 1 -f $work >>$tmp/drain.log 2>&1");
	}
	is( $c->safe_psql(0, q{SELECT count(*) FROM produced p WHERE queue = 'c' AND p.id NOT IN
		(SELECT d.ids[1] FROM done d WHERE d.queue = 'c' AND cardinality(d.ids) = 1 AND d.n = 1)}),
		0, "$what: nothing lost (every acknowledged job completed)");
	is( $c->safe_psql(0, q{SELECT count(*) FROM (SELECT u.id FROM done d, unnest(d.ids) u(id)
		WHERE d.queue = 'c' AND d.n = cardinality(d.ids) GROUP BY u.id HAVING count(*) > 1) x}),
		0, "$what: nothing completed twice");
	$c->safe_psql(0, 'SELECT recover_prepared_transactions()');
	is( join(' ', map { $c->safe_psql($_, "SELECT count(*) FROM pgjq.queue_fence") } 0, 1, 2),
		'0 0 0', "$what: no fence on any node");
	is( join(' ', map { $c->safe_psql($_, 'SELECT count(*) FROM pg_prepared_xacts') } 0, 1, 2),
		'0 0 0', "$what: nothing prepared on any node");
	for my $n (0, 1, 2)
	{
		my $v = $c->safe_psql($n, q{SELECT string_agg(concat_ws(' ', area, object, expected, found), '; ') FROM pgjq.verify()});
		is($v, '', "$what: verify() clean on node $n");
	}
	return;
}

sub kill9
{
	my ($n) = @_;
	my $node = $c->node($n);
	ok(PgjqTest::kill9_restart($node, 0), "node $n killed -9 and started again");
	ok($c->wait_ready($node), "node $n accepts connections");
	return;
}

# -------------------------------------------- one whole move, timed

start_load(0);
ok(wait_for_more('done', 50), 'the load runs');
my $src = home();
my $tgt = $src == 1 ? 2 : 1;
my $t0 = time;
my ($rc, $out, $err) = $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $port{$tgt}, drain_wait => '60 s')");
my $took = time - $t0;
is($rc, 0, 'a whole move under load') or diag $err;
note sprintf('the move took %.3f s: the longest producers were refused (PJ002)', $took);
diag sprintf('PJ002 window (the move, fence to release): %.0f ms', $took * 1000);
ok(wait_for_more('done', 20), 'the load goes on after the move');
stop_load();
check_all('a whole move');

# ------------------------- stopped after each step, a kill, called again

# every step boundary, with each of the three nodes killed there in turn
my @rounds = map { my $s = $_; map { [ $s, $_ ] } (0, 'source', 'target') } 1 .. 5;
my $nround = 0;
for my $round (@rounds)
{
	my ($step, $victim) = @$round;
	my $who = $victim eq '0' ? 'coordinator' : $victim;
	start_load(++$nround);
	ok(wait_for_more('done', 20), "step $step, then the $who: the load runs");
	$src = home();
	$tgt = $src == 1 ? 2 : 1;
	($rc, $out, $err) = $c->psql(0, "SET pgjq.debug_move_stop_after = $step;
		CALL pgjq.move_queues($shard, '127.0.0.1', $port{$tgt}, drain_wait => '60 s')");
	is($rc, 0, "step $step, then the $who: the move stopped after it") or diag $err;
	like($err, qr/stopped after step $step/, "step $step, then the $who: it says so");
	my $n = $victim eq 'source' ? $src : $victim eq 'target' ? $tgt : 0;
	kill9($n);
	($rc, $out, $err) = $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $port{$tgt}, drain_wait => '60 s')");
	is($rc, 0, "step $step, the $who (node $n) killed: the move called again finishes") or diag $err;
	is(home(), $tgt, "step $step, then the $who: the queue is on the target");
	ok(wait_for_more('done', 10), "step $step, then the $who: the load goes on after the move");
	stop_load();
	check_all("step $step, the $who (node $n) killed");
}

# the producers' errors: "moving", a transaction refused whole, a node down
my $down = qr/connection to the remote node|could not commit transaction for shard|terminating connection|server closed the connection|could not connect|the database system is (?:starting up|shutting down|in recovery mode)|connection to server|postmaster was shut down|not yet accepting connections|Connection refused/;
for my $name ('produce', 'produce_rr', 'work_direct')
{
	my @errs = (slurp_file("$tmp/$name.log") =~ /ERROR:\s+([^\n]*)/g);
	my @other = grep { !/is moving to another node|cannot PREPARE a transaction|is served by node|was issued by node/ && !/$down/ } @errs;
	is(scalar(@other), 0, "$name saw only the guard's refusals or a node down")
	  or diag join("\n", grep { defined } @other[0 .. 4]);
}

$c->stop;
done_testing();
