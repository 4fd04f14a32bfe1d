
# Copyright (c) pgjq contributors
#
# The ring engine on a streaming hot standby, and after its promotion.
#
# A standby keeps no ring state in shared memory, so job() and queue_stats
# read the ring's tables there: ready, running (with the lease the primary
# gave) and completed jobs show as on the primary.  Writing calls fail as on
# any read-only server.  After promotion the first call rebuilds the ring
# from the tables: the ready jobs are handed out, the running ones are not
# (their leases run), their holders complete them with their tokens, and
# verify() finds shared memory and the tables in agreement.  A concurrency
# limit and a key limit count the ring's jobs leased on the old primary.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $primary = PostgreSQL::Test::Cluster->new('ring_primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
});
$primary->start;

$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('rs', lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('rs', array_fill('{}'::jsonb, ARRAY[10]));
CREATE TABLE held AS SELECT id, token, lease_until FROM pgjq.claim('rs', 3);
SELECT pgjq.create_queue('rc', concurrency => 3, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('rc', array_fill('{}'::jsonb, ARRAY[5]));
CREATE TABLE held_rc AS SELECT id, token FROM pgjq.claim('rc', 2);
SELECT pgjq.create_queue('rk', key_concurrency => 1, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('rk', array_fill('{}'::jsonb, ARRAY[5]),
       fair_keys => ARRAY['a', 'a', 'b', 'b', 'c']);
CREATE TABLE held_rk AS SELECT id, token FROM pgjq.claim('rk', 2);
});
is($primary->safe_psql('postgres', "SELECT count(*) FROM pgjq.job"),
	'0', 'the jobs are in the ring (pgjq.job holds none)');
my ($done_id, $done_tok) = split /\|/,
  $primary->safe_psql('postgres', 'SELECT id, token FROM held ORDER BY id LIMIT 1');
is($primary->safe_psql('postgres', "SELECT pgjq.complete($done_id, $done_tok)"),
	't', 'one of the three is completed');
$primary->safe_psql('postgres', "DELETE FROM held WHERE id = $done_id");
my $ready_id = $primary->safe_psql('postgres',
	'SELECT max(id) FROM pgjq.ring_body_0 WHERE id NOT IN (SELECT id FROM held)');
my $stats = "SELECT ready || ' ' || running || ' ' || completed FROM pgjq.queue_stats WHERE queue = 'rs'";
is($primary->safe_psql('postgres', $stats), '7 2 1', 'primary: 7 ready, 2 running, 1 completed');

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('ring_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

# ------------------------------------------------------------ reads there
is($standby->safe_psql('postgres', $stats), '7 2 1',
	'standby: queue_stats counts the ring jobs from the tables');
is($standby->safe_psql('postgres', "SELECT state FROM pgjq.job($ready_id)"),
	'ready', 'standby: a ready ring job is ready');
my ($run_id, $run_tok, $run_until) = split /\|/,
  $primary->safe_psql('postgres', 'SELECT id, token, lease_until FROM held ORDER BY id LIMIT 1');
is( $standby->safe_psql(
		'postgres',
		"SELECT state || ' ' || (lease_until = '$run_until'::timestamptz) FROM pgjq.job($run_id)"),
	'running true',
	'standby: a running ring job is running, with its lease');
is($standby->safe_psql('postgres', "SELECT state FROM pgjq.job($done_id)"),
	'completed', 'standby: a completed ring job is completed');
# a heartbeat on the primary: its 'h' log row gives the standby the new lease
my $hb_until = $primary->safe_psql('postgres',
	"SELECT pgjq.heartbeat($run_id, $run_tok, '2 hours')");
$primary->wait_for_catchup($standby);
is( $standby->safe_psql(
		'postgres',
		"SELECT state || ' ' || (lease_until = '$hb_until'::timestamptz) FROM pgjq.job($run_id)"),
	'running true',
	'standby: a heartbeated ring job has the heartbeat\'s lease');
# a cancellation requested on the primary: its 'q' log row tells the standby
my ($cx_id, $cx_tok) = split /\|/, $primary->safe_psql(
	'postgres', q{
SELECT pgjq.create_queue('rx', lease => '1 hour');
SELECT pgjq.enqueue('rx') IS NOT NULL;
SELECT c.id, c.token FROM pgjq.claim('rx', 1) c, pgjq.cancel(c.id) x;
});
$cx_id = (split /\n/, $cx_id)[-1];
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', "SELECT state || ' ' || cancel_requested FROM pgjq.job($cx_id)"),
	'running true', 'standby: a running ring job whose cancellation was requested says so');
is( $standby->safe_psql(
		'postgres',
		"SELECT sum(value) FROM pgjq.metrics('rs') WHERE name = 'pgjq_jobs' AND labels->>'state' IN ('ready', 'running')"
	),
	'9',
	'standby: metrics() gauges count the ring jobs');

my ($rc, $out, $err) = $standby->psql('postgres', "SELECT pgjq.enqueue('rs')");
isnt($rc, 0, 'standby: enqueue fails');
like($err, qr/read-only|recovery/, 'standby: as on any read-only server');

# ------------------------------------------------------------ promotion
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby was not promoted';
is( $standby->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('rs', 20)"),
	'7',
	'promoted: the 7 ready jobs are handed out, the 2 leased ones are not');
is( $standby->safe_psql(
		'postgres',
		"SELECT bool_and(pgjq.complete(id, token)) FROM held"),
	't',
	'promoted: the holders of the leases complete their jobs with their tokens');
is($standby->safe_psql('postgres', $stats), '0 7 3',
	'promoted: 7 running, 3 completed');
# limits.c counts the ring's running jobs after the rebuild: 2 run, 3 may
is($standby->safe_psql('postgres', "SELECT count(*) FROM pgjq.claim('rc', 10)"),
	'1', 'promoted: a concurrency limit counts the ring jobs leased before the promotion');
# and per key: a and b each run one job, c none
is($standby->safe_psql('postgres', "SELECT string_agg(fair_key, ',') FROM pgjq.claim('rk', 10)"),
	'c', 'promoted: a key limit counts the ring jobs leased before the promotion, per key');
is($standby->safe_psql('postgres', "SELECT cancel_requested FROM pgjq.job($cx_id)"),
	't', 'promoted: the rebuild keeps a requested cancellation');
is( $standby->safe_psql(
		'postgres',
		"SELECT pgjq.complete($cx_id, $cx_tok); SELECT state FROM pgjq.job($cx_id)"),
	"f\ncancelled", 'promoted: its holder\'s completion ends it as cancelled');
verify_ok($standby, 'postgres', 'promoted: shared memory and the tables agree');
like(slurp_file($standby->logfile), qr/pgjq: ring of database \d+ rebuilt: 13 ready, 7 in flight/,
	'promoted: the ring was rebuilt from its tables');

$standby->stop;
$primary->stop;
done_testing();
