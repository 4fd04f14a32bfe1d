
# Copyright (c) pgjq contributors
#
# What pg_stat_activity shows while pgjq's processes sleep.  On PostgreSQL 17
# and later an extension names its wait events (src/common/wait_events.c):
# a claim waiting for a job is "PgjqClaim", wait_jobs() "PgjqWaitJobs", a
# database's worker between its steps "PgjqWorkerMain", the launcher
# "PgjqLauncherMain", all of type "Extension".  On PostgreSQL 15 every one
# is the single event "Extension".  The names are registered once in the
# server and shared: a second waiting claim shows the same name.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('wait_events');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q');});

my $named = $node->pg_version >= 17;
my %want = $named
  ? (claim => 'PgjqClaim', wait_jobs => 'PgjqWaitJobs', worker => 'PgjqWorkerMain',
	launcher => 'PgjqLauncherMain')
  : (claim => 'Extension', wait_jobs => 'Extension', worker => 'Extension', launcher => 'Extension');
note('PostgreSQL ' . $node->pg_version . ($named ? ': named wait events' : ': one event "Extension"'));

# the event of the process(es) a condition selects, once they sleep
sub event_of
{
	my ($where, $what) = @_;
	my $q = "SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity WHERE $where";
	$node->poll_query_until('postgres', "SELECT ($q) IS NOT NULL AND ($q) NOT LIKE '%/ClientRead'")
	  or diag("$what never slept");
	return $node->safe_psql('postgres', $q);
}

is(event_of(q{backend_type = 'pgjq launcher'}, 'the launcher'),
	"Extension/$want{launcher}", 'the launcher sleeps as ' . $want{launcher});
is(event_of(q{backend_type = 'pgjq worker' AND datname = 'postgres'}, 'the worker'),
	"Extension/$want{worker}", "the database's worker sleeps as $want{worker}");

# a waiting claim, and a second one beside it (the name is registered once)
my @claims = map { $node->background_psql('postgres') } (1 .. 2);
my @pids = map { $_->query_safe('SELECT pg_backend_pid()') } @claims;
for my $c (@claims)
{
	$c->{stdin} .= "SELECT count(*) FROM pgjq.claim('q', wait => '30 s');\n";
	$c->{run}->pump_nb();
}
for my $i (0 .. 1)
{
	is(event_of("pid = $pids[$i]", "claim $i"), "Extension/$want{claim}",
		'a waiting claim (' . ($i + 1) . " of 2) sleeps as $want{claim}");
}

# wait_jobs on a job nobody runs
my $id = $node->safe_psql('postgres', q{SELECT pgjq.enqueue('q', delay => '1 hour')});
my $w = $node->background_psql('postgres');
my $wpid = $w->query_safe('SELECT pg_backend_pid()');
$w->{stdin} .= "SELECT count(*) FROM pgjq.wait_jobs(ARRAY[$id]::bigint[], '30 s');\n";
$w->{run}->pump_nb();
is(event_of("pid = $wpid", 'wait_jobs'), "Extension/$want{wait_jobs}",
	"wait_jobs() sleeps as $want{wait_jobs}");

# the waiters end at once when their statements are cancelled
$node->safe_psql('postgres', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid IN ($pids[0], $pids[1], $wpid)");
$_->{run}->kill_kill for (@claims, $w);

$node->stop;
done_testing();
