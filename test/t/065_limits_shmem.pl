
# Copyright (c) pgjq contributors
#
# The shared-memory limit counters at their edges:
#
# - after a restart, the first call that touches the counters may be an
#   outcome (complete, fail): the counters are rebuilt before that call's own
#   change, so concurrency and key_concurrency still hold for 8 claimers
#   that then claim at once in open transactions;
# - pgjq.max_databases: databases are created and dropped in turn, many more
#   than there are slots; with every slot taken by a live database, a further
#   database refuses ring queues' enqueues with configuration_limit_exceeded
#   (53400) and a hint (the ring keeps its state per database in those
#   slots), and gets a slot once a database is dropped;
# - pgjq.max_tracked_keys is a hard cap: queues without a key limit track no
#   keys, a claim that needs more key entries than are free fails with
#   program_limit_exceeded (54000) and a hint while claims that need none
#   still work, and the entries of dropped queues are given back;
# - a key limit added by alter_queue counts the queue's running keys, and
#   hands out nothing while a claim that did not track keys is still open.
#
# Nothing here depends on timing: every claim runs in an open transaction
# and what it got is counted.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('limits_shmem');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.max_databases = 3
pgjq.max_tracked_keys = 16
});
$node->start;

# Run $sql in $n sessions at once, each in a transaction left open; return
# the first line each printed and the sessions (to be ended with end_all).
sub claim_in_open_transactions
{
	my ($db, $n, $sql) = @_;
	my @s = map { $node->background_psql($db) } 1 .. $n;
	$_->query_safe('BEGIN') for @s;
	for my $s (@s)
	{
		$s->{stdin} .= "$sql;\n";
		$s->{run}->pump_nb();
	}
	my @got = map { (split /\n/, $_->query_safe("SELECT 'sync'"))[0] } @s;
	return (\@got, \@s);
}

sub end_all
{
	my ($s) = @_;
	for (@$s)
	{
		$_->query_safe('COMMIT');
		$_->quit;
	}
}

sub sum { my $t = 0; $t += $_ for @_; return $t; }

# ========================= an outcome is the first counter user after restart

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('lim', concurrency => 2, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('lim', array_fill('{}'::jsonb, ARRAY[20]));
SELECT pgjq.create_queue('klim', key_concurrency => 2, lease => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('klim', array_fill('{}'::jsonb, ARRAY[20]),
                                       fair_keys => array_fill('a'::text, ARRAY[20]));
});

{
	my @held = split /\n/,
	  $node->safe_psql('postgres', "SELECT id || ',' || token FROM pgjq.claim('lim', 5) ORDER BY id");
	is(scalar(@held), 2, 'concurrency 2: a claim gets 2 jobs');

	$node->restart;
	my ($id, $token) = split /,/, $held[0];
	is($node->safe_psql('postgres', "SELECT pgjq.complete($id, $token)"),
		't', 'after a restart, complete() is the first call');
	my ($got, $s) = claim_in_open_transactions('postgres', 8,
		"SELECT count(*) FROM pgjq.claim('lim', 5)");
	is(sum(@$got), 1, '8 claimers at once get exactly the one free slot');
	end_all($s);
	is( $node->safe_psql('postgres',
			"SELECT running FROM pgjq.queue_stats WHERE queue = 'lim'"),
		'2', 'concurrency 2 holds: 2 jobs run');
}

{
	my @held = split /\n/,
	  $node->safe_psql('postgres', "SELECT id || ',' || token FROM pgjq.claim('klim', 5) ORDER BY id");
	is(scalar(@held), 2, 'key_concurrency 2: a claim of one key gets 2 jobs');

	$node->restart;
	my ($id, $token) = split /,/, $held[0];
	is( $node->safe_psql('postgres',
			"SELECT pgjq.fail($id, $token, 'boom', retry_in => '1 hour')"),
		'retry', 'after a restart, fail() is the first call');
	my ($got, $s) = claim_in_open_transactions('postgres', 8,
		"SELECT count(*) FROM pgjq.claim('klim', 5)");
	is(sum(@$got), 1, '8 claimers at once get exactly the one free slot of the key');
	end_all($s);
	is( $node->safe_psql('postgres',
			"SELECT running FROM pgjq.queue_stats WHERE queue = 'klim'"),
		'2', 'key_concurrency 2 holds: 2 jobs of the key run');
}

$node->safe_psql('postgres', 'DROP EXTENSION pgjq');
$node->restart;

# ============================================= more databases than slots

# Every new database gets the extension from template1.
$node->safe_psql('template1', 'CREATE EXTENSION pgjq');

my $use_limits = q{
SELECT pgjq.create_queue('lq', concurrency => 1);
SELECT count(*) FROM pgjq.enqueue_many('lq', array_fill('{}'::jsonb, ARRAY[2]));
SELECT count(*) FROM pgjq.claim('lq', 5);
};

my $cycled = 0;
for my $i (1 .. 8)
{
	$node->safe_psql('postgres', "CREATE DATABASE cycle$i");
	my ($ret, $out, $err) = $node->psql('cycle' . $i, $use_limits);
	$cycled++ if $ret == 0 && $out =~ /\n1$/;
	$node->safe_psql('postgres', "DROP DATABASE cycle$i");
}
is($cycled, 8, '8 databases created and dropped in turn all get a slot (3 slots)');

for my $i (1 .. 4)
{
	$node->safe_psql('postgres', "CREATE DATABASE live$i");
}
for my $i (1 .. 3)
{
	is($node->safe_psql("live$i", $use_limits), "\n2\n1",
		"live database $i of 3 uses a limited queue");
}
{
	# The ring keeps a record per database in the same pgjq.max_databases
	# records: without one, no queue of the database can take jobs.
	my ($ret, $out, $err) = $node->psql('live4', $use_limits,
		extra_params => [ '-v', 'VERBOSITY=verbose', '-v', 'ON_ERROR_STOP=1' ]);
	like($err, qr/53400.*serves at most 3 databases/,
		'a 4th live database: a ring queue\'s enqueue raises 53400');
	like($err, qr/HINT:.*pgjq\.max_databases/, '... with a hint naming pgjq.max_databases');
	($ret, $out, $err) = $node->psql(
		'live4', q{
SELECT pgjq.create_queue('free');
SELECT pgjq.enqueue('free', '{}') > 0;
}, extra_params => [ '-v', 'VERBOSITY=verbose', '-v', 'ON_ERROR_STOP=1' ]);
	like($err, qr/53400/, '... so does one without limits (no slot for its ring state)');
}
$node->safe_psql('postgres', 'DROP DATABASE live1');
# lq got no job while there was no slot: enqueue them now
is( $node->safe_psql('live4',
		"SELECT count(*) FROM pgjq.enqueue_many('lq', array_fill('{}'::jsonb, ARRAY[2]));"
		  . " SELECT count(*) FROM pgjq.claim('lq', 5)"),
	"2\n1", 'once a database is dropped, its slot serves the 4th database\'s limited queue');
for my $i (2 .. 4)
{
	$node->safe_psql('postgres', "DROP DATABASE live$i");
}

# ====================================================== max_tracked_keys

$node->safe_psql('postgres', 'CREATE DATABASE keys');
is( $node->safe_psql(
		'keys', q{
SELECT pgjq.create_queue('free');
SELECT count(*) FROM pgjq.enqueue_many('free', array_fill('{}'::jsonb, ARRAY[40]),
    fair_keys => ARRAY(SELECT 'k' || i FROM generate_series(1, 40) i));
SELECT count(*) FROM pgjq.claim('free', 40);
}),
	"\n40\n40",
	'a queue without a key limit runs 40 distinct keys with 16 tracked keys');

$node->safe_psql(
	'keys', q{
SELECT pgjq.create_queue('kl', key_concurrency => 1);
SELECT count(*) FROM pgjq.enqueue_many('kl', array_fill('{}'::jsonb, ARRAY[40]),
    fair_keys => ARRAY(SELECT 'k' || i FROM generate_series(1, 40) i));
});
{
	my ($ret, $out, $err) = $node->psql('keys', "SELECT count(*) FROM pgjq.claim('kl', 40)",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/54000/, 'a claim needing 40 key entries of 16 raises 54000');
	like($err, qr/HINT:.*pgjq\.max_tracked_keys/, '... with a hint naming pgjq.max_tracked_keys');
}
my @k = split /\n/,
  $node->safe_psql('keys', "SELECT id || ',' || token FROM pgjq.claim('kl', 5)");
is(scalar(@k), 5, 'a smaller claim of the key-limited queue still works');
is( $node->safe_psql(
		'keys', "SELECT count(*) FROM pgjq.claim('free', 5)"),
	'0', '... and so does one of the queue without limits (empty now)');
$node->safe_psql('keys',
	"SELECT pgjq.complete(ARRAY[" . join(',', map { (split /,/)[0] } @k) . "]::bigint[], ARRAY["
	  . join(',', map { (split /,/)[1] } @k) . "]::bigint[])");
is($node->safe_psql('keys', "SELECT count(*) FROM pgjq.claim('kl', 10)"),
	'10', 'finished keys give their entries back');

# A key limit added later: the keys of the queue are counted then, and not
# while a claim that did not track them is still open.
$node->safe_psql(
	'keys', q{
SELECT pgjq.create_queue('late');
SELECT count(*) FROM pgjq.enqueue_many('late', array_fill('{}'::jsonb, ARRAY[6]),
                                       fair_keys => array_fill('x'::text, ARRAY[6]));
SELECT count(*) FROM pgjq.claim('late', 1);
});
{
	my $open = $node->background_psql('keys');
	$open->query_safe('BEGIN');
	is($open->query_safe("SELECT count(*) FROM pgjq.claim('late', 1)"),
		'1', 'a claim without a key limit, left open');
	$node->safe_psql('keys', "SELECT pgjq.alter_queue('late', key_concurrency => 3)");
	is($node->safe_psql('keys', "SELECT count(*) FROM pgjq.claim('late', 5)"),
		'0', 'key limit added: nothing is handed out while an untracked claim is open');
	$open->query_safe('COMMIT');
	$open->quit;
}
is($node->safe_psql('keys', "SELECT count(*) FROM pgjq.claim('late', 5)"),
	'1', '... then the key is counted: 2 run, 1 more of 3');
is($node->safe_psql('keys', "SELECT count(*) FROM pgjq.claim('late', 5)"),
	'0', '... and no more');

# queue churn: every dropped queue gives its entry back
my $churned = 0;
for my $i (1 .. 30)
{
	my ($ret, $out, $err) = $node->psql(
		'keys', qq{
SELECT pgjq.create_queue('churn$i', concurrency => 5);
SELECT pgjq.enqueue('churn$i', '{}') > 0;
SELECT count(*) FROM pgjq.claim('churn$i', 5);
SELECT pgjq.drop_queue('churn$i', force => true);
});
	$churned++ if $ret == 0;
}
is($churned, 30, '30 queues created, claimed from and dropped in turn with 16 entries');

verify_ok($node, 'keys', 'after the churn, shared memory and the tables agree');

$node->stop;
done_testing();
