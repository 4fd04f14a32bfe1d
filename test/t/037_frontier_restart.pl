
# Copyright (c) pgjq contributors
#
# Due jobs keep being handed out after restarts (issue 28, finding 1): the
# recipe of bench/fr1/run, scaled down.  Producers and workers run on one
# queue; the postmaster and all its children are killed (-9) at once and
# the server started again; then 20,000 jobs are enqueued due over 4 s
# (200 distinct run_at values, 20 ms apart, 100 jobs each) and 4 clients
# claim(100) and complete with the background worker promoting.  Every job
# must be handed out, none before its run_at, within a bound of its run_at
# (a correctness bound: a stranded job never comes; the bench measures the
# lateness, docs/benchmarks.md), and verify() must agree.  The same after a
# clean restart, and once more after the ring has turned (small slots).
# (bench/fr1/run has the same on a fresh server, for comparison.)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('frontier_restart');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.ring_slot_rows = 5000
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgjq');
$node->safe_psql('postgres',
	'CREATE UNLOGGED TABLE handed (id bigint, late float8, early bool)');

sub sql { return $node->safe_psql('postgres', $_[0]); }


my $tmp = PostgreSQL::Test::Utils::tempdir;

sub write_file
{
	my ($name, $text) = @_;
	open my $fh, '>', "$tmp/$name" or die $!;
	print $fh $text;
	close $fh;
	return "$tmp/$name";
}

my $produce = write_file('produce.sql', "SELECT pgjq.enqueue('load', '{}');\n");
my $work = write_file('work.sql', <<'SQL');
SELECT coalesce(max(id), 0) AS id, coalesce(max(token), 0) AS tok FROM pgjq.claim('load', 1) \gset
\if :id > 0
SELECT pgjq.complete(:id, :tok);
\endif
SQL
# claim(100), note each job's lateness (claim time - run_at, carried in the
# payload) and complete them, in one statement; a client stops after 1 s
# with nothing to claim once the window's end has passed
my $pick = write_file('pick.sql', <<'SQL');
WITH c AS (SELECT id, token, payload FROM pgjq.claim(:q, 100)),
     h AS (INSERT INTO handed SELECT id, extract(epoch FROM clock_timestamp()) - (payload->>'t')::float8,
                                     clock_timestamp() < to_timestamp((payload->>'t')::float8) FROM c
           RETURNING 1)
SELECT count(*) AS n, (SELECT count(pgjq.complete(id, token)) FROM c) AS done FROM h \gset
\if :n = 0
\sleep 5 ms
\endif
SQL

sub load_then
{
	my ($how) = @_;
	sql("SELECT pgjq.create_queue('load') WHERE NOT EXISTS (SELECT FROM pgjq.list_queues() WHERE queue = 'load')");
	my @cmd = ('pgbench', '-n', '-T', '4', '-h', $node->host, '-p', $node->port);
	my $p = IPC::Run::start([ @cmd, '-c', '6', '-f', $produce, 'postgres' ], '>', '/dev/null', '2>', '/dev/null');
	my $w = IPC::Run::start([ @cmd, '-c', '6', '-f', $work, 'postgres' ], '>', '/dev/null', '2>', '/dev/null');
	sleep 3;
	if ($how eq 'kill')
	{
		ok(kill9_restart($node, 0), 'kill -9 of the postmaster and its children: started again');
	}
	else
	{
		$node->restart;
	}
	eval { $p->finish; };
	eval { $w->finish; };
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pgjq worker'")
	  or diag 'no pgjq worker';
	1 while sql("SELECT count(pgjq.complete(c.id, c.token)) FROM pgjq.claim('load', 1000) c") > 0;
}

sub recipe
{
	my ($label) = @_;
	my $q = "due_$label";
	sql("SELECT pgjq.create_queue('$q'); TRUNCATE handed");
	my $t0 = sql("SELECT extract(epoch FROM now() + interval '2 s')");
	for my $step (0 .. 3)
	{
		sql("SELECT count(*) FROM generate_series(0, 49) g,
		       LATERAL pgjq.enqueue_many('$q',
		         array_fill(jsonb_build_object('t', $t0 + ($step * 50 + g) * 0.02), ARRAY[100]),
		         run_at => to_timestamp($t0 + ($step * 50 + g) * 0.02)) e");
	}
	my $secs = int($t0 - time) + 4 + 5;
	my $r = IPC::Run::run(
		[
			'pgbench', '-n', '-c', '4', '-T', $secs, '-D', "q='$q'", '-f', $pick,
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'>', "$tmp/pick_$label.log", '2>&1');
	my ($n, $early, $max, $p99) = split /\|/,
	  sql("SELECT count(*), count(*) FILTER (WHERE early), round(max(late)::numeric, 3),
	              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY late)::numeric, 3) FROM handed");
	is($n, '20000', "$label: all 20,000 due jobs handed out");
	is($early, '0', "$label: none before its run_at");
	cmp_ok($max, '<', 5, "$label: each within 5 s of its run_at (p99 $p99 s, max $max s)");
	is(sql("SELECT ready || ' ' || scheduled FROM pgjq.queue_stats WHERE queue = '$q'"), '0 0',
		"$label: nothing left ready or scheduled");
	verify_ok($node, 'postgres', $label);
}

load_then('kill');
recipe('after_kill');
load_then('restart');
recipe('after_restart');
# the ring turns (slots of 5,000 rows: the recipes alone turned it), then a kill
load_then('kill');
recipe('after_turns');

$node->stop;
done_testing();
