
# Copyright (c) pgjq contributors
#
# The dedup options survive a kill -9 of the postmaster, as their durable
# rows say: a ready ring job replaced by a duplicate (on_duplicate =>
# 'replace') comes back once, with the new payload and the same id; a
# 'waiting' key freed by a committed claim stays free (the claimed job is
# not handed out again before its lease ends); a dedup_for key stays held.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('dedup_restart');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{CREATE EXTENSION pgjq; SELECT pgjq.create_queue('dr', lease => '1 hour');});
my $r = sql(q{SELECT pgjq.enqueue('dr', '{"v": 1}', dedup_key => 'r')});
is(sql(q{SELECT pgjq.enqueue('dr', '{"v": 2}', dedup_key => 'r', on_duplicate => 'replace')}),
	$r, 'replace: the same id');
my $w = sql(q{SELECT pgjq.enqueue('dr', '{"w": 1}', dedup_key => 'w', dedup_scope => 'waiting', priority => -1)});
is(sql(q{SELECT string_agg(id::text, ',') FROM pgjq.claim('dr', 1)}), $w, 'the waiting-scope job claimed');
my $p = sql(q{SELECT pgjq.enqueue('dr', '{"p": 1}', delay => '1 hour', dedup_key => 'p', dedup_for => '1 day')});

ok(kill9_restart($node, 0), 'the server starts again after kill -9 of the postmaster');

PgjqTest::verify_ok($node, 'postgres', 'verify() after the restart');
is(sql(q{SELECT pgjq.enqueue('dr', '{"p": 2}', dedup_key => 'p', dedup_for => '1 day')}), $p,
	'the dedup_for key is still held');
my $w2 = sql(q{SELECT pgjq.enqueue('dr', '{"w": 2}', dedup_key => 'w', dedup_scope => 'waiting')});
isnt($w2, $w, 'the waiting-scope key stays free after its claim');
is(sql(q{SELECT string_agg(id || ':' || (payload->>'v') || ':' || attempt, ',' ORDER BY id)
           FROM pgjq.claim('dr', 10) WHERE payload ? 'v'}),
	"$r:2:1", 'the replaced job comes back once, with the new payload and its first attempt');
is(sql(qq{SELECT state FROM pgjq.job($w)}), 'running', 'the claimed job is still running (its lease holds)');
is(sql(q{SELECT count(*) FROM pgjq.claim('dr', 10)}), '0', 'nothing else to claim: the new waiting job was taken above');
PgjqTest::verify_ok($node, 'postgres', 'verify() at the end');

$node->stop;
done_testing();
