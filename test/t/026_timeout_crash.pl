
# Copyright (c) pgjq contributors
#
# A timeout (a queue's, or a job's own) survives a crash: the claim's 'c'
# log row carries its deadline, the rebuild reads it back, so after a kill -9 of the postmaster
# a heartbeat still cannot extend the lease past the deadline and returns
# NULL once it has passed, and the background worker ends the attempt as
# timed out.  A relocated claim (its row copied forward) keeps it too.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('timeout_crash');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '200ms'
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

my $timeout = 6;    # seconds
sql("CREATE EXTENSION pgjq;
     SELECT pgjq.create_queue('t', lease => '1 hour', timeout => '$timeout s', backoff_base => '1 hour');
     SELECT pgjq.create_queue('plain', lease => '1 hour');");
sql(q{SELECT pgjq.enqueue('t', '{"n": 1}'); SELECT pgjq.enqueue('plain', '{"n": 2}')});
my ($id, $token, $deadline) = split /\|/, sql(
	"SELECT id, token, extract(epoch FROM clock_timestamp() + interval '$timeout s') FROM pgjq.claim('t')");
my ($pid, $ptoken) = split /\|/, sql(q{SELECT id, token FROM pgjq.claim('plain')});
# a job's own timeout, in the queue without one
sql("SELECT pgjq.enqueue('plain', '{\"own\": 1}', timeout => '$timeout s')");
my ($oid, $otoken, $odeadline) = split /\|/, sql(
	"SELECT id, token, extract(epoch FROM clock_timestamp() + interval '$timeout s') FROM pgjq.claim('plain')");
ok($id && $token, 'a job of the timed queue claimed');

# kill -9 of the postmaster, then start it again
ok(kill9_restart($node, 0), 'the server starts again after kill -9 of the postmaster');

my $lease = sql("SELECT extract(epoch FROM pgjq.heartbeat($id, $token, '1 hour'))");
ok($lease ne '' && $lease <= $deadline + 0.01,
	"after the crash a heartbeat still stops at the deadline ($lease <= $deadline)");
my $olease = sql("SELECT extract(epoch FROM pgjq.heartbeat($oid, $otoken, '1 hour'))");
ok($olease ne '' && $olease <= $odeadline + 0.01,
	"... and so does one of a job with its own timeout ($olease <= $odeadline)");
my $plain = sql("SELECT pgjq.heartbeat($pid, $ptoken, '1 hour') > clock_timestamp() + interval '50 minutes'");
is($plain, 't', 'a job of a queue without timeout keeps its full extension');

# wait past the deadline
usleep(100_000) while time < $odeadline + 0.2;
is(sql("SELECT pgjq.heartbeat($id, $token, '1 hour') IS NULL"), 't',
	'past the deadline the heartbeat returns NULL');

# the worker rescues it (its lease ended at the deadline)
ok( $node->poll_query_until(
		'postgres', "SELECT state = 'scheduled' FROM pgjq.job($id)"),
	'the worker ended the attempt');
is(sql("SELECT attempt || ' ' || last_error FROM pgjq.job($id)"),
	"1 timed out: still running at its execution deadline (timeout)",
	'as timed out, one attempt spent');
ok( $node->poll_query_until(
		'postgres', "SELECT last_error LIKE 'timed out:%' FROM pgjq.job($oid)"),
	'the job with its own timeout timed out too');
is(sql("SELECT state FROM pgjq.job($pid)"), 'running', 'the job without a timeout is still running');
is(sql('SELECT count(*) FROM pgjq.verify()'), '0', 'verify() finds nothing amiss');

$node->stop;
done_testing();
