
# Copyright (c) pgjq contributors
#
# The vacuum horizon guard (pgjq.health() and the background worker's
# warning), with the three kinds of holder pinned for real:
#
# 1. A session idle in transaction after taking a transaction id: health()
#    names it (pid, role, application, state, transaction start) to a member
#    of pgjq_admin who is not a superuser, with its ages; the worker logs one
#    WARNING naming the pid once pgjq.horizon_warn_after (2 s here) has
#    passed, and no other over later passes; when the session commits, one
#    LOG line says the horizon is released and health() stops naming it.
# 2. A prepared transaction: named by its gid, held since its PREPARE.
# 3. A logical replication slot (its catalog_xmin): named by the slot, with
#    no age in time (NULL): the worker counts from when it first saw it.
#
# Timing: the worker passes at least every second (pgjq.max_sleep), the
# threshold is 2 s; every wait for a log line or a health() row is a poll
# with the harness's timeout.  "Once" is counted after the worker has been
# seen to run several more passes (a job delayed 3 s is promoted by it).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('horizon');
$node->init(allows_streaming => 'logical');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
pgjq.horizon_warn_after = '2s'
max_prepared_transactions = 5
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
CREATE ROLE app LOGIN;
CREATE ROLE ops LOGIN IN ROLE pgjq_admin;
SELECT pgjq.create_queue('tick');
});

# health() as ops (pgjq_admin, not a superuser), one row, columns by name
sub health
{
	my $out = $node->safe_psql(
		'postgres', q{
SELECT coalesce(horizon_holder, ''), coalesce(horizon_xid::text, ''), horizon_age_xacts,
       coalesce(horizon_age_seconds::text, 'null'), coalesce(pid::text, ''),
       coalesce(usename, ''), coalesce(application_name, ''), coalesce(state, ''),
       coalesce((horizon_held_since = xact_start)::text, ''),
       coalesce(slot_name, ''), coalesce(gid, ''),
       coalesce(horizon_held_since::text, 'null')
  FROM pgjq.health()},
		extra_params => [ '-U', 'ops' ]);
	my %h;
	@h{
		qw(holder xid age_xacts age_seconds pid usename application_name
		  state since_is_xact_start slot_name gid held_since)
	} = split /\|/, $out, -1;
	return \%h;
}

sub count_in_log
{
	my ($re, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my $n = () = $log =~ /$re/g;
	return $n;
}

# Wait until the worker has run passes for at least $secs more seconds: a job
# delayed that long is promoted by the worker (not by us).
sub wait_worker_passes
{
	my ($secs) = @_;
	my $id = $node->safe_psql('postgres',
		"SELECT pgjq.enqueue('tick', delay => '$secs s')");
	$node->poll_query_until('postgres',
		"SELECT state = 'ready' FROM pgjq.job($id)")
	  or die "the worker did not promote job $id";
	$node->safe_psql('postgres',
		"SELECT pgjq.complete(id, token) FROM pgjq.claim('tick')");
}

# ------------------------------------------------ before: nothing is held

my $h = health();
ok($h->{holder} eq '' || $h->{age_seconds} < 2,
	'at start nothing holds the horizon for 2 s');

# -------------------------------------- 1. a session idle in transaction

my $offset = -s $node->logfile;
my $pin = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$pin->query_safe("SET application_name = 'pinner'");
my $pid = $pin->query_safe('SELECT pg_backend_pid()');
$pin->query_safe('BEGIN');
my $xid = $pin->query_safe('SELECT txid_current()');

$node->poll_query_until('postgres',
	"SELECT pid = $pid AND state = 'idle in transaction' FROM pgjq.health()")
  or die 'health() never named the pinning session';
$h = health();
is($h->{holder}, 'backend', 'health(): the holder is a backend');
is($h->{pid}, $pid, "health(): its pid ($pid)");
is($h->{xid}, $xid, 'health(): the horizon is its transaction id');
cmp_ok($h->{age_xacts}, '>=', 1, 'health(): its age in transactions');
cmp_ok($h->{age_seconds}, '>=', 0, 'health(): its age in seconds');
is($h->{usename}, 'app', 'health(): its role, visible to a non-superuser admin');
is($h->{application_name}, 'pinner', 'health(): its application name');
is($h->{state}, 'idle in transaction', 'health(): its state');
is($h->{since_is_xact_start}, 'true', 'health(): held since its transaction began');
is($h->{slot_name} . $h->{gid}, '', 'health(): no slot, no gid');

my $warning = qr/WARNING:  pgjq: xmin horizon of database "postgres" held for [^\n]* by process $pid \(application "pinner", state "idle in transaction"\)/;
$node->wait_for_log($warning, $offset);
ok(1, 'the worker warns, naming the pid, the application and the state');
$h = health();
cmp_ok($h->{age_seconds}, '>=', 2, 'health() agrees the horizon is held past the threshold');

wait_worker_passes(3);
is(count_in_log($warning, $offset), 1,
	'one warning over several passes, not one per pass');

my $release = qr/LOG:  pgjq: xmin horizon of database "postgres" no longer held by process $pid\b/;
is(count_in_log($release, $offset), 0, 'no release while it is held');
$pin->query_safe('COMMIT');
$node->wait_for_log($release, $offset);
ok(1, 'the worker logs the release');
$h = health();
isnt($h->{pid}, $pid, 'health() no longer names the session');
ok($h->{holder} eq '' || $h->{age_seconds} < 2,
	'health(): nothing holds the horizon for 2 s after the release');
wait_worker_passes(2);
is(count_in_log($release, $offset), 1, 'the release is logged once');
is(count_in_log($warning, $offset), 1, 'and no new warning for that session');
$pin->quit;

# ---------------------------------------------- 2. a prepared transaction

$offset = -s $node->logfile;
$node->safe_psql('postgres',
	"BEGIN; SELECT txid_current(); PREPARE TRANSACTION 'pgjq-forgotten'");
# a poll: a snapshot taken just before the PREPARE (autovacuum's) is older
$node->poll_query_until('postgres',
	"SELECT horizon_holder = 'prepared transaction' FROM pgjq.health()")
  or die 'health() never named the prepared transaction';
$h = health();
is($h->{holder}, 'prepared transaction', 'health(): the holder is a prepared transaction');
is($h->{gid}, 'pgjq-forgotten', 'health(): its gid');
is($h->{pid}, '', 'health(): no pid');
isnt($h->{held_since}, 'null', 'health(): held since it was prepared');
isnt($h->{age_seconds}, 'null', 'health(): its age in seconds');
my $warning_2pc = qr/WARNING:  pgjq: xmin horizon of database "postgres" held for [^\n]* by prepared transaction "pgjq-forgotten"/;
$node->wait_for_log($warning_2pc, $offset);
ok(1, 'the worker warns, naming the gid');
$node->safe_psql('postgres', "ROLLBACK PREPARED 'pgjq-forgotten'");
$node->wait_for_log(
	qr/LOG:  pgjq: xmin horizon of database "postgres" no longer held by prepared transaction "pgjq-forgotten"/,
	$offset);
ok(1, 'the worker logs its release');
is(count_in_log($warning_2pc, $offset), 1, 'one warning for the prepared transaction');

# ---------------------------------------------- 3. a logical replication slot

$offset = -s $node->logfile;
$node->safe_psql('postgres',
	"SELECT pg_create_logical_replication_slot('pgjq_forgotten', 'test_decoding')");
$node->poll_query_until('postgres',
	"SELECT horizon_holder = 'replication slot' FROM pgjq.health()")
  or die 'health() never named the slot';
$h = health();
is($h->{slot_name}, 'pgjq_forgotten', 'health(): the slot name');
is($h->{age_seconds}, 'null', 'health(): a slot has no age in time');
is($h->{held_since}, 'null', 'health(): nor a start');
is($h->{xid},
	$node->safe_psql('postgres',
		"SELECT catalog_xmin FROM pg_replication_slots WHERE slot_name = 'pgjq_forgotten'"),
	'health(): the horizon is the slot\'s catalog_xmin');
my $warning_slot = qr/WARNING:  pgjq: xmin horizon of database "postgres" held for at least [^\n]* by replication slot "pgjq_forgotten"/;
$node->wait_for_log($warning_slot, $offset);
ok(1, 'the worker warns, naming the slot');
$node->safe_psql('postgres', "SELECT pg_drop_replication_slot('pgjq_forgotten')");
$node->wait_for_log(
	qr/LOG:  pgjq: xmin horizon of database "postgres" no longer held by replication slot "pgjq_forgotten"/,
	$offset);
ok(1, 'the worker logs the slot\'s release');
is(count_in_log($warning_slot, $offset), 1, 'one warning for the slot');

# ------------------------------------------------- 0 turns the guard off

$offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "pgjq.horizon_warn_after = 0\n");
$node->reload;
$pin = $node->background_psql('postgres');
$pid = $pin->query_safe('SELECT pg_backend_pid()');
$pin->query_safe('BEGIN');
$pin->query_safe('SELECT txid_current()');
$node->poll_query_until('postgres', "SELECT pid = $pid FROM pgjq.health()")
  or die 'health() never named the second pinning session';
wait_worker_passes(4);
is(count_in_log(qr/WARNING:  pgjq: xmin horizon/, $offset), 0,
	'with pgjq.horizon_warn_after = 0 the worker does not warn');
is($node->safe_psql('postgres', "SELECT pid FROM pgjq.health()"), $pid,
	'health() still reports the holder');
$pin->query_safe('COMMIT');
$pin->quit;

is(count_in_log(qr/pgjq worker .* exited/, 0), 0, 'the worker never exited');

$node->stop;
done_testing();
