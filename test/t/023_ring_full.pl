
# Copyright (c) pgjq contributors
#
# The ring holds at most pgjq.ring_positions ready jobs in shared memory.
# An enqueue that would take it past that (less 1/16 kept as headroom for
# producers that ask at the same time) stores its jobs as ready rows of
# pgjq.job instead, which claims move into the ring: a backlog beyond the
# ring's memory is slower (a row written and deleted per job), never refused
# and never lost.  Once the ring has drained, enqueues go to the ring again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('ring_full');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_positions = 1024
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('full')");
sql(q{CREATE TABLE got (id bigint, token bigint);
CREATE VIEW stores AS
SELECT (SELECT count(*) FROM pgjq.job j JOIN pgjq.queue q USING (queue_id) WHERE q.name = 'full') AS table_rows,
	   (SELECT count(*) FROM (SELECT queue_id FROM pgjq.ring_body_0 UNION ALL SELECT queue_id FROM pgjq.ring_body_1
			UNION ALL SELECT queue_id FROM pgjq.ring_body_2 UNION ALL SELECT queue_id FROM pgjq.ring_body_3) b
		 JOIN pgjq.queue q USING (queue_id) WHERE q.name = 'full') AS ring_bodies});

my $enq = "SELECT count(*) FROM pgjq.enqueue_many('full', array_fill('{}'::jsonb, ARRAY[%d]))";
is(sql(sprintf($enq, 500)), '500', 'an enqueue that fits goes to the ring');
is(sql('SELECT table_rows || \' \' || ring_bodies FROM stores'), '0 500', '... 500 bodies in the ring');
is(sql(sprintf($enq, 500)), '500', 'an enqueue past the ring\'s positions is not refused');
is(sql('SELECT table_rows || \' \' || ring_bodies FROM stores'), '500 500',
	'... its jobs are ready rows of pgjq.job');
is(sql(sprintf($enq, 2000)), '2000', 'a larger one too');
is(sql("SELECT ready FROM pgjq.queue_stats WHERE queue = 'full'"), '3000',
	'queue_stats counts both stores: 3000 ready');

# drain: every job handed out once, from both stores
for (1 .. 40)
{
	last if sql(q{
WITH c AS (INSERT INTO got SELECT id, token FROM pgjq.claim('full', 100) RETURNING id, token)
SELECT count(*) FROM c, pgjq.complete(c.id, c.token) ok WHERE ok}) eq '0';
}
is(sql('SELECT count(*) || \' \' || count(DISTINCT id) FROM got'), '3000 3000',
	'all 3000 jobs claimed and completed, each once');
is(sql("SELECT ready || ' ' || running || ' ' || completed FROM pgjq.queue_stats WHERE queue = 'full'"),
	'0 0 3000', 'nothing left, 3000 completed');
PgjqTest::verify_ok($node, 'postgres', 'verify() after the drain');

sql(sprintf($enq, 10));
is(sql('SELECT table_rows FROM stores'), '0', 'with room again, an enqueue goes to the ring');

$node->stop;
done_testing();
