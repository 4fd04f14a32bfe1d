
# Copyright (c) pgjq contributors
#
# A claim or a completion truncates a finished ring slot only in a
# transaction of its own statement (the worker's "ring space" step does it
# in any case).  In a client's transaction block the slot's ACCESS EXCLUSIVE
# lock would last until the client commits, blocking every reader of the
# slot (job(id) opens the bodies of all slots: review L4), and the
# truncation would make PREPARE TRANSACTION of an empty claim fail (README
# promises that an empty claim prepares: review L6).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('client_truncate');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.ring_slot_rows = 1
max_prepared_transactions = 2
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q'); SELECT pgjq.create_queue('e')");
sub size0 { return sql("SELECT pg_relation_size('pgjq.ring_body_0')"); }

# a job in slot 0, finished; the next one seals slot 0: it can be truncated
sql("SELECT pgjq.enqueue('q', '{}')");
is(sql("SELECT count(*) FROM pgjq.claim('q') c, pgjq.complete(c.id, c.token) ok WHERE ok"),
	'1', 'the first job (slot 0) claimed and completed');
my $id = sql("SELECT pgjq.enqueue('q', '{}')");
cmp_ok(size0(), '>', 0, 'slot 0 is sealed and finished, not truncated yet');

# an empty claim in a transaction block: no truncation, no lock on slot 0
my $a = $node->background_psql('postgres');
$a->query_safe('BEGIN');
is($a->query_safe("SELECT count(*) FROM pgjq.claim('e')"), '0', 'an empty claim in a block');
is( sql("SET statement_timeout = '3s'; SELECT state FROM pgjq.job($id)"),
	'ready', '... job(id) of another session is not blocked by it');
cmp_ok(size0(), '>', 0, '... slot 0 not truncated by it');
$a->query_safe("PREPARE TRANSACTION 'pgjq_l6'");
is(sql('SELECT count(*) FROM pg_prepared_xacts'), '1', '... and the block prepares');
sql("COMMIT PREPARED 'pgjq_l6'");
$a->quit;

# a claim in a statement of its own truncates the slot
is(sql("SELECT count(*) FROM pgjq.claim('q') c, pgjq.complete(c.id, c.token) ok WHERE ok"),
	'1', 'a claim in its own statement');
is(size0(), '0', '... truncated slot 0');
verify_ok($node, 'postgres', 'after the truncation');
$node->stop;
done_testing();
