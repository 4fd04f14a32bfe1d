
# Copyright (c) pgjq contributors
#
# A due job the ring engine has no room for (its lane is new and
# pgjq.ring_max_lanes are in use; likewise a queue record or a priority
# ring) must not hold back the promotion of the other due jobs: it stays in
# pgjq.job as a ready row, which claims move into the ring once there is
# room; health() counts it and the log says it once.  (0.2.0: the ring's
# ERROR aborted the whole promotion, every pass: review M3.)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('promote_bound');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_max_lanes = 16
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('a'); SELECT pgjq.create_queue('b')");
sql("CREATE TABLE got (id bigint, token bigint)");

# due soon: one job of b (a new lane: no room for it by then), three of a
# (the lane of key k1, which will exist)
sql("SELECT pgjq.enqueue('b', '{}', fair_key => 'bx', delay => '1 s')");
sql("SELECT pgjq.enqueue('a', '{}', fair_key => 'k1', delay => '1.1 s') FROM generate_series(1, 3)");

# every lane in use: ready jobs of a, one key each, until the ring refuses
my $lanes = 0;
for my $i (1 .. 100)
{
	my ($ret) = $node->psql('postgres', "SELECT pgjq.enqueue('a', '{}', fair_key => 'k$i')");
	last if $ret != 0;
	$lanes++;
}
cmp_ok($lanes, '>=', 16, "$lanes lanes in use, then an enqueue on a new lane is refused");
sleep(2);

my $offset = -s $node->logfile;
is(sql('SELECT pgjq.promote()'), '4',
	'promote() goes through: 3 due jobs into the ring, 1 a ready row of pgjq.job');
is(sql("SELECT ready FROM pgjq.queue_stats WHERE queue = 'b'"), '1', "b's job counts as ready");
is(sql("SELECT state FROM pgjq.job j, pgjq.queue q WHERE j.queue_id = q.queue_id AND q.name = 'b'"),
	'r', '... a ready row of pgjq.job');
is( sql(q{
WITH c AS (INSERT INTO got SELECT id, token FROM pgjq.claim('a', 1000) RETURNING 1)
SELECT count(*) FROM c}), $lanes + 3, "a's ready and promoted jobs are all claimed");
is(sql('SELECT ring_refused || \' \' || ring_refused_bound || \' \' || (ring_refused_at IS NOT NULL) FROM pgjq.health()'),
	'1 lanes true', 'health(): one refused, for want of lanes');

# another one refused: counted, not logged again
sql("SELECT pgjq.enqueue('b', '{}', fair_key => 'by', delay => '0.1 s')");
sleep(1);
is(sql('SELECT pgjq.promote()'), '1', 'the next due job of b: a ready row too');
is(sql('SELECT ring_refused FROM pgjq.health()'), '2', 'health() counts 2');
my $log = slurp_file($node->logfile, $offset);
my @said = $log =~ /WARNING:  pgjq's ring engine has no room for more lanes: 1 due jobs stay ready in pgjq.job/g;
is(scalar(@said), 1, 'the log says it once');

# lanes free again: b's jobs are claimed from pgjq.job
is(sql('SELECT count(*) FROM got, pgjq.complete(got.id, got.token) ok WHERE ok'), $lanes + 3,
	"a's jobs completed: their lanes go");
is(sql("SELECT count(*) FROM pgjq.claim('b', 10)"), '2', "b's two jobs are claimed");
verify_ok($node, 'postgres', 'after the refusals');
$node->stop;
done_testing();
