
# Copyright (c) pgjq contributors
#
# A held key survives a kill -9 of the postmaster: the ring's rebuild loads
# pgjq.key_holds, so after the restart claims still skip the key's jobs
# (none of its attempts spent), and release_key() hands them out again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('key_hold_restart');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('kr');
SELECT count(*) FROM pgjq.enqueue_many('kr', array_fill('{}'::jsonb, ARRAY[4]),
                                       fair_keys => ARRAY['held', 'held', 'free', 'free']);
SELECT pgjq.hold_key('kr', 'held', now() + interval '1 hour');});
is(sql(q{SELECT string_agg(fair_key, ',') FROM pgjq.claim('kr', 1)}), 'free', 'before: the free key only');

# kill -9 of the postmaster, then start it again
ok(kill9_restart($node, 0), 'the server starts again after kill -9 of the postmaster');

is(sql(q{SELECT string_agg(fair_key, ',') FROM pgjq.claim('kr', 10)}), 'free',
	'after the restart: still the free key only');
is(sql(q{SELECT held_keys FROM pgjq.queue_stats WHERE queue = 'kr'}), '1', 'queue_stats shows the hold');
is(sql(q{SELECT pgjq.release_key('kr', 'held')}), 't', 'release_key');
is(sql(q{SELECT string_agg(fair_key || ':' || attempt, ',') FROM pgjq.claim('kr', 10)}), 'held:1,held:1',
	'the held jobs come out, no attempt spent');
PgjqTest::verify_ok($node, 'postgres', 'verify() after the restart');

$node->stop;
done_testing();
