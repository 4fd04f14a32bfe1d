# Copyright (c) pgjq contributors
#
# Dependencies with the background worker: it releases a waiting job when
# its dependencies complete (a chain, a fan-in), woken by the completing
# commit (a waiting claim gets the released job without polling); and
# across crashes:
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

# ------------------------------------------------------------- a chain

sql(q{SELECT count(*) FROM pgjq.enqueue_many('dq',
	ARRAY['{"n": "c1"}', '{"n": "c2"}', '{"n": "c3"}']::jsonb[],
	after => ARRAY['[]', '["#1"]', '["#2"]']::jsonb[])});
my @order;
for my $step (1 .. 3)
{
	my ($id, $tok, $n) = split /\|/, claim_one('10 s');
	push @order, $n // 'none';
	sql("SELECT pgjq.complete($id, $tok)") if $id;
}
is(join(',', @order), 'c1,c2,c3', 'a chain runs in order, each released by the worker');

# ------------------------------------------------------------- a fan-in

sql(q{SELECT count(*) FROM pgjq.enqueue_many('dq',
	array_fill('{"n": "leaf"}'::jsonb, ARRAY[200]) || '{"n": "callback"}'::jsonb,
	after => array_fill('[]'::jsonb, ARRAY[200])
	         || (SELECT jsonb_agg('#' || i) FROM generate_series(1, 200) i))});
is(sql(q{SELECT waiting FROM pgjq.queue_stats WHERE queue = 'dq'}), '1', 'the callback waits');
my $leaves = 0;
for (1 .. 20)
{
	$leaves += sql(q{SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('dq', 10)});
}
is($leaves, 200, 'the 200 leaves ran');
my (undef, $cbtok, $cb) = split /\|/, claim_one('10 s');
is($cb, 'callback', 'the fan-in callback is released after the last leaf');

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
