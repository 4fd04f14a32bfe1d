
# Copyright (c) pgjq contributors
#
# Shared memory's records of the ring engine are bounded cluster-wide
# (pgjq.ring_max_queues, ring_max_lanes, ring_positions, ring_max_in_flight)
# and are given back when nothing needs them: a queue's record when the
# queue is empty (at once when it is dropped, else when a new queue needs
# room), a lane's and a priority's when their last job ends, and everything
# of a database when the database or the extension is dropped.  0.2.0 kept
# queue records forever (after ring_max_queues queues since the start no new
# queue could take a job) and kept a dropped database's positions and
# in-flight entries until a restart.
#
# PGJQ_TEST_QUEUES sets how many queues the first loop creates and drops
# (default 10000; fewer for a quick run).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $nqueues = $ENV{PGJQ_TEST_QUEUES} || 10000;

my $node = PostgreSQL::Test::Cluster->new('ring_records');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_max_queues = 16
pgjq.ring_max_lanes = 16
pgjq.ring_positions = 1024
pgjq.ring_max_in_flight = 64
});
$node->start;
sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

sql('postgres', 'CREATE EXTENSION pgjq');

# one queue at a time: created, fed, drained and dropped, each in its own
# transaction; ring_max_queues is 16
my $cycle = q{
DO $$
DECLARE c record;
BEGIN
	FOR i IN 1..%d LOOP
		PERFORM pgjq.create_queue('h1_' || i);
		PERFORM pgjq.enqueue_many('h1_' || i, ARRAY['{}', '{}', '{}']::jsonb[], priority => i %% 7,
								  fair_keys => ARRAY['a' || i, 'b', NULL]);
		COMMIT;
		FOR c IN SELECT id, token FROM pgjq.claim('h1_' || i, 10) LOOP
			PERFORM pgjq.complete(c.id, c.token);
		END LOOP;
		COMMIT;
		%s
		COMMIT;
	END LOOP;
END $$};
my ($ret, $out, $err) =
  $node->psql('postgres', sprintf($cycle, $nqueues, q{PERFORM pgjq.drop_queue('h1_' || i);}));
is($ret, 0, "$nqueues queues created, used and dropped one after another")
  or diag $err;
is(sql('postgres', q{SELECT sum(completed) FROM pgjq.queue_stats}) || '0', '0',
	'... no queue left');

# the same without the drop: 40 empty queues stay; a new one takes the
# record of an empty one
($ret, $out, $err) = $node->psql('postgres', sprintf($cycle, 40, ''));
is($ret, 0, '40 queues created and used, none dropped') or diag $err;
is(sql('postgres', q{SELECT count(*) || ' ' || sum(completed) FROM pgjq.queue_stats}),
	'40 120', '... each completed its 3 jobs');
is(sql('postgres', q{SELECT count(*) FROM pgjq.enqueue('h1_1', '{}')}), '1',
	'an old queue takes a job again');
is(sql('postgres', q{SELECT count(*) FROM pgjq.claim('h1_1', 10)}), '1', '... and hands it out');
PgjqTest::verify_ok($node, 'postgres', 'after the queues');
sql('postgres', q{SELECT pgjq.drop_queue('h1_' || i, force => true) FROM generate_series(1, 40) i});

# ---------------------------------------------------------------------
# a dropped database, a dropped extension: their positions and in-flight
# entries are given back
# a queue's ready jobs in pgjq.job (spilled: the ring had no room) and in all
my $stores = q{
SELECT (SELECT count(*) FROM pgjq.job j JOIN pgjq.queue q USING (queue_id) WHERE q.name = '%s') || ' ' ||
	   (SELECT ready + running FROM pgjq.queue_stats WHERE queue = '%s')};
sql('postgres', q{SELECT pgjq.create_queue('main')});

# fill the ring from another database: 600 ready and 50 running jobs
sub fill
{
	my ($db) = @_;
	sql($db, q{SELECT pgjq.create_queue('backlog')});
	is(sql($db, q{SELECT count(*) FROM pgjq.enqueue_many('backlog', array_fill('{}'::jsonb, ARRAY[650]))}),
		'650', "$db: 650 jobs enqueued");
	is(sql($db, q{SELECT count(*) FROM pgjq.claim('backlog', 50)}), '50', "$db: 50 of them claimed");
	is(sql($db, sprintf($stores, 'backlog', 'backlog')), '0 650', "$db: all in the ring");
}

# this database's share then: 600 ready in the ring, 60 claimed at once
sub check_room
{
	my ($what) = @_;
	is(sql('postgres', q{SELECT count(*) FROM pgjq.enqueue_many('main', array_fill('{}'::jsonb, ARRAY[600]))}),
		'600', "$what: 600 jobs enqueued here");
	is(sql('postgres', sprintf($stores, 'main', 'main')), '0 600',
		"$what: all of them in the ring, none spilled to pgjq.job");
	is(sql('postgres', q{
WITH c AS (SELECT id, token FROM pgjq.claim('main', 60))
SELECT count(*) FROM c, pgjq.complete(c.id, c.token) ok WHERE ok}), '60',
		"$what: 60 claimed at once (pgjq.ring_max_in_flight = 64)");
	sql('postgres', q{SELECT pgjq.purge('main')});
}

sql('postgres', 'CREATE DATABASE gone');
sql('gone', 'CREATE EXTENSION pgjq');
fill('gone');
sql('postgres', 'DROP DATABASE gone');
check_room('after DROP DATABASE');

sql('postgres', 'CREATE DATABASE noext');
sql('noext', 'CREATE EXTENSION pgjq');
fill('noext');
sql('noext', 'DROP EXTENSION pgjq CASCADE');
check_room('after DROP EXTENSION');

# a DROP EXTENSION that rolls back keeps the ring's state
sql('noext', 'CREATE EXTENSION pgjq');
fill('noext');
sql('noext', 'BEGIN; DROP EXTENSION pgjq CASCADE; ROLLBACK');
is(sql('noext', q{SELECT ready || ' ' || running FROM pgjq.queue_stats}), '600 50',
	'a rolled-back DROP EXTENSION keeps the jobs');
is(sql('noext', q{SELECT count(*) FROM pgjq.claim('backlog', 5)}), '5', '... and serves them');
PgjqTest::verify_ok($node, 'noext', 'after a rolled-back DROP EXTENSION');
sql('noext', q{SELECT pgjq.drop_queue('backlog', force => true)});

# ---------------------------------------------------------------------
# a queue with ready jobs of 40 priorities and 20 held keys, restarted with
# room for 16 holds: the rebuild takes every priority (0.2.0 failed there
# for good: "priorities is too small") and reports the holds it could not
# keep, after it released the ring's lock
$node->append_conf('postgresql.conf', "pgjq.ring_max_lanes = 64\npgjq.ring_max_holds = 20");
$node->restart;
sql('postgres', q{SELECT pgjq.create_queue('prio')});
is(sql('postgres', q{SELECT count(*) FROM generate_series(1, 40) p, LATERAL pgjq.enqueue('prio', '{}', priority => p) e}),
	'40', '40 jobs of 40 priorities enqueued');
sql('postgres', q{SELECT pgjq.hold_key('prio', 'k' || i, now() + interval '1 hour') FROM generate_series(1, 20) i});
$node->append_conf('postgresql.conf', 'pgjq.ring_max_holds = 16');
$node->restart;
my $offset = -s $node->logfile;
($ret, $out, $err) = $node->psql('postgres', q{SELECT count(*) FROM pgjq.claim('prio', 100)});
is($out, '40', 'after a restart, the jobs of all 40 priorities are claimed');
like($err, qr/4 held keys of this database do not fit in pgjq.ring_max_holds and are not held/,
	'the rebuild reports the 4 holds beyond pgjq.ring_max_holds');
ok($node->log_contains(qr/WARNING:  4 held keys of this database do not fit/, $offset),
	'... in the log too');
sql('postgres', q{SELECT pgjq.drop_queue('prio', force => true)});

PgjqTest::verify_ok($node, 'postgres', 'at the end');

$node->stop;
done_testing();
