# Copyright (c) pgjq contributors
#
# Dependencies with the background worker: it releases a waiting job when
# its dependencies complete (a chain of 1,000, a fan-in of 10,000), woken by
# the completing commit (a waiting claim gets the released job without
# polling); and across crashes:
# - a completion that crashes after its commit record and before anything
#   else (pgjq.debug_crash_at = 'commit'): the event for the worker is lost
#   with shared memory, and the worker's first pass after the restart finds
#   the finished dependency and releases its dependent;
# - kill -9 of the postmaster with jobs waiting: the restarted worker rebuilds
#   its set of dependency targets, so a dependency completed after the
#   restart still releases its dependents, and a cancel still cascades.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('deps_worker');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '10s'
restart_after_crash = on
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('dq', lease => '10 min', max_attempts => 1);});
$node->poll_query_until('postgres',
	q{SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'pgjq worker'})
  or die 'no worker';

# claim one job, waiting for it in the server (no polling): "id|token|n"
sub claim_one
{
	my ($wait) = @_;
	return sql(qq{SELECT id || '|' || token || '|' || (payload->>'n')
		FROM pgjq.claim('dq', 1, wait => '$wait')});
}

# A client that claims one batch (waiting in the server for up to 5 s, no
# polling) and completes it in the same statement, noting each job; a claim
# that finds nothing stops the client (pgbench counts it as failed).
my $step = $node->basedir . '/step.sql';
open my $fh, '>', $step or die $!;
print $fh <<'SQL';
WITH c AS (SELECT id, token FROM pgjq.claim(:q, :batch, wait => '5 s')),
     i AS (INSERT INTO ran SELECT c.id, clock_timestamp() FROM c WHERE pgjq.complete(c.id, c.token) RETURNING 1)
SELECT count(*) AS n FROM i \gset
\if :n = 0
\shell false
\endif
SQL
close $fh;
sql(q{CREATE TABLE ran (id bigint PRIMARY KEY, at timestamptz NOT NULL)});

# ------------------------------------------------------ a chain of 1,000

sql(q{SELECT pgjq.create_queue('chain');
SELECT count(*) FROM pgjq.enqueue_many('chain', array_fill('{}'::jsonb, ARRAY[1000]),
	after => ARRAY['[]'::jsonb] || ARRAY(SELECT jsonb_build_array('#' || k) FROM generate_series(1, 999) k))});
$node->command_ok(
	[ 'pgbench', '-n', '-M', 'extended', '-c', '1', '-t', '1000', '-f', $step,
		'-D', 'q=chain', '-D', 'batch=1', 'postgres' ],
	'a chain of 1,000: each job released by the worker and claimed in turn');
is(sql(q{SELECT count(*) FROM ran r, pgjq.job(r.id) j WHERE j.queue = 'chain' AND j.state = 'completed'}),
	'1000', 'all 1,000 completed');
is(sql(q{SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY at) AS prev FROM ran) s
          WHERE prev IS NOT NULL AND id <> prev + 1}), '0', 'in chain order');

# ----------------------------------------------------- a fan-in of 10,000

sql(q{TRUNCATE ran; SELECT pgjq.create_queue('fanin')});
my $cb = sql(q{SELECT max(x) FROM pgjq.enqueue_many('fanin',
	array_fill('{}'::jsonb, ARRAY[10001]),
	after => array_fill('[]'::jsonb, ARRAY[10000])
	         || (SELECT jsonb_agg('#' || k) FROM generate_series(1, 10000) k)) x});
is(sql(qq{SELECT state || ' ' || cardinality(waiting_for) FROM pgjq.job($cb)}), 'waiting 10000',
	'the callback waits for its 10,000 leaves');
# 4 clients until one finds nothing for 5 s; the callback comes last
$node->command_checks_all(
	[ 'pgbench', '-n', '-M', 'extended', '-c', '4', '-j', '2', '-T', '120', '-f', $step,
		'-D', 'q=fanin', '-D', 'batch=10', 'postgres' ],
	2, [qr/actually processed/], [qr/could not launch shell command/],
	'a fan-in of 10,000: the clients stop when nothing is left');
is(sql(q{SELECT count(*) FROM ran}), '10001', 'every leaf and the callback ran');
is(sql(qq{SELECT count(*) FROM ran r, pgjq.job(r.id) j WHERE j.state = 'completed'}), '10001',
	'all completed');
ok(sql(qq{SELECT (SELECT at FROM ran WHERE id = $cb) > (SELECT max(at) FROM ran WHERE id <> $cb)}) eq 't',
	'the callback ran after the last leaf');

# ------------------------------------ a crash right after a completion's commit

my $x = sql(q{SELECT pgjq.enqueue('dq', '{"n": "x"}')});
my $d = sql(qq{SELECT pgjq.enqueue('dq', '{"n": "after_x"}', after => ARRAY[$x]::bigint[])});
my (undef, $xtok) = split /\|/, claim_one('1 s');
crash_at($node, 'commit', "SELECT pgjq.complete($x, $xtok)", 'completion');
is(sql(qq{SELECT state FROM pgjq.job($x)}), 'completed', 'the completion stands');
my (undef, undef, $n) = split /\|/, claim_one('10 s');
is($n, 'after_x', 'the restarted worker releases the dependent');

# ------------------------------------------- kill -9 with jobs waiting

my $y = sql(q{SELECT pgjq.enqueue('dq', '{"n": "y"}', delay => '2 s')});
my $k = sql(qq{SELECT pgjq.enqueue('dq', '{"n": "after_y"}', after => ARRAY[$y]::bigint[])});
my $z = sql(q{SELECT pgjq.enqueue('dq', '{"n": "z"}', delay => '1 hour')});
my $kz = sql(qq{SELECT pgjq.enqueue('dq', '{"n": "after_z"}', after => ARRAY[$z]::bigint[])});
ok(kill9_restart($node, 0), 'the server starts again after kill -9 of the postmaster');
is(sql(qq{SELECT state FROM pgjq.job($k)}), 'waiting', 'the dependent still waits');
my ($yid, $ytok, $yn) = split /\|/, claim_one('10 s');
is($yn, 'y', 'the dependency comes due');
sql("SELECT pgjq.complete($yid, $ytok)");
(undef, undef, $n) = split /\|/, claim_one('10 s');
is($n, 'after_y', 'completed after the restart: its dependent is released');
sql("SELECT pgjq.cancel($z)");
ok( $node->poll_query_until('postgres', qq{SELECT state FROM pgjq.job($kz)}, 'cancelled'),
	'a cancel after the restart cascades');
is(sql(qq{SELECT last_error FROM pgjq.job($kz)}), "dependency $z ended cancelled", 'naming the dependency');
is(sql(q{SELECT count(*) FROM pgjq.job_dependency}), '0', 'no edge is left open');
verify_ok($node, 'postgres', 'after the crashes');

$node->stop;
done_testing();
