
# Copyright (c) pgjq contributors
#
# Crashes at the moments kill -9 from outside rarely hits, injected with the
# test-only setting pgjq.debug_crash_at (crash_points.c: the process sends
# itself SIGKILL there):
#
# - "commit": after the commit record is written and before pgjq's shared
#   memory follows the commit.  A completion, a claim and an enqueue of a
#   delayed job each crash there.  After the crash restart the commit stands
#   (the job is completed / running with its lease / there), the limit
#   counters rebuilt from the tables free exactly the completed job's slot
#   and count the claimed one, the claimed job is not handed out again, and
#   the delayed job is still promoted on time.
# - "worker_chunk": the background worker dies between two committed chunks
#   of a large promotion; the chunks before stay promoted, the rest are
#   promoted after the restart, none twice.
# - dedup anchors across crashes: a keyed job's completion that crashes at
#   "commit" has deleted its anchor (the key is free after the restart); a
#   keyed job ready across a kill -9 still holds its key, and once claimed
#   and held across another kill -9, its completion with the old token ends
#   the anchor too (the rebuild marks the job anchored from its body).
#
# Each case ends with pgjq.verify() finding shared memory and the tables in
# agreement.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('crash_points');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
restart_after_crash = on
});
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('lim', concurrency => 2, lease => '600 s');
SELECT count(*) FROM pgjq.enqueue_many('lim', array_fill('{}'::jsonb, ARRAY[4]));
});

# ------------------------------------------------ a completion, at commit

my ($id1, $tok1, $id2, $tok2) = split /[|\n]/,
  $node->safe_psql('postgres', "SELECT id, token FROM pgjq.claim('lim', 10) ORDER BY id");
ok($tok2, 'two jobs are running at the limit');
crash_at($node, 'commit', "SELECT pgjq.complete($id1, $tok1)", 'complete');
is($node->safe_psql('postgres', "SELECT state FROM pgjq.job($id1)"),
	'completed', 'complete: the committed completion stands');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('lim', 10)"),
	'1', 'complete: the rebuilt counters free exactly its slot');
verify_ok($node, 'postgres', 'after the crash in a completion\'s commit');

# ------------------------------------------------------ a claim, at commit

# the job's id comes from its enqueue (a ring job has no pgjq.job row to look
# it up in), and job(id) shows its state
my (undef, $cid) = split /\n/, $node->safe_psql('postgres',
	"SELECT pgjq.create_queue('c', lease => '600 s'); SELECT pgjq.enqueue('c')");
crash_at($node, 'commit', "SELECT id FROM pgjq.claim('c')", 'claim');
is( $node->safe_psql(
		'postgres', qq{SELECT state || ',' || (lease_until > now() + interval '500 s')
		   FROM pgjq.job($cid)}
	),
	'running,true',
	'claim: the committed claim stands, with its lease');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('c', 10)"),
	'0', 'claim: the job is not handed out again');
verify_ok($node, 'postgres', 'after the crash in a claim\'s commit');

# ---------------------------------------- a delayed enqueue, at commit

$node->safe_psql('postgres', "SELECT pgjq.create_queue('d')");
crash_at($node, 'commit', "SELECT pgjq.enqueue('d', delay => '2 s')", 'enqueue');
is($node->safe_psql('postgres', "SELECT scheduled + ready FROM pgjq.queue_stats WHERE queue = 'd'"),
	'1', 'enqueue: the committed job is there');
ok( $node->poll_query_until(
		'postgres', "SELECT ready FROM pgjq.queue_stats WHERE queue = 'd'", '1'),
	'enqueue: the worker promotes it after the restart');
verify_ok($node, 'postgres', 'after the crash in an enqueue\'s commit');

# --------------------------------- the worker, between promotion chunks

my $n = 3500;    # more than three chunks of 1000
$node->safe_psql('postgres',
	"SELECT pgjq.create_queue('w'); SELECT count(*) FROM pgjq.enqueue_many('w', array_fill('{}'::jsonb, ARRAY[$n]), delay => '3 s')"
);
my $offset = -s $node->logfile;
# the worker reads the database's settings when it starts
$node->safe_psql('postgres', "ALTER DATABASE postgres SET pgjq.debug_crash_at = 'worker_chunk'");
$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE backend_type = 'pgjq worker' AND datname = 'postgres'});
$node->wait_for_log(qr/pgjq: crashing at point "worker_chunk"/, $offset);
# the restarted worker would crash again at its first chunk: take the
# setting away as soon as the server is back
my $reset = 0;
for (1 .. 600)
{
	my ($ret) = $node->psql('postgres', 'ALTER DATABASE postgres RESET pgjq.debug_crash_at');
	if ($ret == 0)
	{
		$reset = 1;
		last;
	}
	usleep(50_000);
}
ok($reset, 'worker: the setting is taken away after the crash');
# A worker that connected before the reset may still crash once more at its
# next chunk (the server restarts again): read with retries, not safe_psql.
# After the last chunk no crash point is left, so what follows is stable.
my $promoted_at_crash = -1;
for (1 .. 600)
{
	my ($ret, $out) = $node->psql('postgres', "SELECT ready FROM pgjq.queue_stats WHERE queue = 'w'");
	if ($ret == 0)
	{
		$promoted_at_crash = $out;
		last;
	}
	usleep(50_000);
}
note "$promoted_at_crash of $n promoted when the setting was taken away";
cmp_ok($promoted_at_crash, '>=', 1000, 'worker: the chunk committed before the crash stays promoted');
ok( $node->poll_query_until(
		'postgres', "SELECT ready FROM pgjq.queue_stats WHERE queue = 'w'", $n),
	'worker: every job is promoted after the restart');
is($node->safe_psql('postgres', "SELECT scheduled + ready + running FROM pgjq.queue_stats WHERE queue = 'w'"),
	$n, 'worker: none lost, none twice');
verify_ok($node, 'postgres', 'after the worker\'s crash between chunks');

# --------------------------------------------------------- dedup anchors
$node->safe_psql('postgres', "SELECT pgjq.create_queue('dk', lease => '600 s')");
my $k1 = $node->safe_psql('postgres', "SELECT pgjq.enqueue('dk', '{}', dedup_key => 'k1')");
my $k2 = $node->safe_psql('postgres', "SELECT pgjq.enqueue('dk', '{}', dedup_key => 'k2')");
my (undef, $ktok1) = split /\|/,
  $node->safe_psql('postgres', "SELECT id, token FROM pgjq.claim('dk', 1)");
crash_at($node, 'commit', "SELECT pgjq.complete($k1, $ktok1)", 'complete of a keyed job');
is($node->safe_psql('postgres', "SELECT state FROM pgjq.job($k1)"), 'completed',
	'keyed: the committed completion stands');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.job WHERE id = $k1"), '0',
	'keyed: its anchor went with it');
isnt($node->safe_psql('postgres', "SELECT pgjq.enqueue('dk', '{}', dedup_key => 'k1')"), $k1,
	'keyed: its key is free: a new job');
is($node->safe_psql('postgres', "SELECT pgjq.enqueue('dk', '{}', dedup_key => 'k2')"), $k2,
	'keyed: the ready job still holds its key after the crash');
$node->safe_psql('postgres', "SELECT pgjq.cancel(id) FROM pgjq.job WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'dk') AND dedup_key = 'k1'");
my (undef, $ktok2) = split /\|/,
  $node->safe_psql('postgres', "SELECT id, token FROM pgjq.claim('dk', 1)");
ok($ktok2, 'keyed: the ready job is claimed');
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', "SELECT pgjq.enqueue('dk', '{}', dedup_key => 'k2')"), $k2,
	'keyed: the running job holds its key across a kill -9');
is($node->safe_psql('postgres', "SELECT pgjq.complete($k2, $ktok2)"), 't',
	'keyed: its holder completes it with the token it had');
is($node->safe_psql('postgres', "SELECT count(*) FROM pgjq.job WHERE dedup_key IS NOT NULL"), '0',
	'keyed: no anchor is left');
verify_ok($node, 'postgres', 'after the crashes with keyed jobs');

$node->stop;
done_testing();
