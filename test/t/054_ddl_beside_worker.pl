
# Copyright (c) pgjq contributors
#
# DDL on the extension never deadlocks with pgjq's own background worker
# (test/BUGS.md, "DROP EXTENSION deadlocks with the worker's prune step").
#
# A database served by the worker, which works all the time: due jobs to
# promote, expired leases to rescue, a dependency to release, a schedule
# firing every second, history to summarize and prune, and each step's
# transaction held open 20 ms (pgjq.debug_worker_step_ms) so that DDL meets
# it inside its steps.  100 rounds of CREATE EXTENSION pgjq VERSION '0.4.0'
# with that load, ALTER EXTENSION pgjq UPDATE, and DROP EXTENSION pgjq
# CASCADE; each ALTER and DROP is sent while the worker is inside a given
# step (pg_stat_activity polled until it is), the steps taken in turn.  Before
# the fix about one round in a few ended in "deadlock detected" (the worker
# held one of pgjq's tables and waited for another, the DDL the other way
# round).  Asserted: every statement succeeds, and the statements met the
# worker inside each of its steps (read from pg_stat_activity just before
# each one).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $rounds = 100;

my $node = PostgreSQL::Test::Cluster->new('ddl_beside_worker');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'd'
pgjq.max_sleep = '50ms'
pgjq.prune_interval = '1s'
pgjq.debug_worker_step_ms = 20
deadlock_timeout = '100ms'
log_min_messages = debug1
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE d');

my $s = $node->background_psql('d', on_error_stop => 0);

# The worker's step right now ('idle' between steps or while it sleeps).
sub worker_step
{
	my $step = $s->query_safe(
		q{SELECT coalesce(max(query) FILTER (WHERE state = 'active'), 'idle')
		    FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'd'});
	return $step;
}

my (%met, @errors);
my @steps = ('pgjq: rescue', 'pgjq: promote', 'pgjq: schedules', 'pgjq: dependencies',
	'pgjq: counters', 'pgjq: prune', 'pgjq: history summaries', 'pgjq: horizon',
	'pgjq: next deadline', 'pgjq: ring space');
my $turn = 0;

# Run one DDL statement, when the worker is inside the next step in turn
# (or after 2 s, wherever it is then); note the step it met and any error.
sub ddl
{
	my ($round, $sql, $aim) = @_;
	my $step;
	for (1 .. 1000)
	{
		$step = worker_step();
		last if !defined $aim || $step eq $aim;
		usleep(1000);
	}
	$met{$step}++;
	$s->{stdin} .= "$sql;\n\\echo 'ddl done'\n";
	$s->{stderr} = '';
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/ddl done\n/)
	  or die "round $round: $sql did not finish";
	$s->{stdout} = '';
	push @errors, "round $round, $sql (worker in \"$step\"): $s->{stderr}"
	  if $s->{stderr} =~ /ERROR|FATAL/;
}

for my $round (1 .. $rounds)
{
	ddl($round, "CREATE EXTENSION pgjq VERSION '0.4.0'");
	$s->query_safe(
		q{SELECT pgjq.create_queue('q', lease => '30 ms', retention => '1 ms', backoff_base => '10 ms');
		  SELECT pgjq.enqueue_many('q', array_fill('{}'::jsonb, ARRAY[20]), delay => '40 ms');
		  SELECT pgjq.enqueue_many('q', array_fill('{}'::jsonb, ARRAY[10]));
		  SELECT count(*) FROM pgjq.claim('q', 5);
		  SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('q', 3);
		  SELECT pgjq.enqueue('q', '{}', after => ARRAY[pgjq.enqueue('q', '{}', delay => '30 ms')]);
		  SELECT pgjq.schedule('tick', '@every 1 second', 'q');});
	ddl($round, 'ALTER EXTENSION pgjq UPDATE', $steps[ $turn++ % @steps ]);
	ddl($round, 'DROP EXTENSION pgjq CASCADE', $steps[ $turn++ % @steps ]);
}

is(join("\n", @errors), '', "$rounds rounds of CREATE, ALTER UPDATE and DROP EXTENSION beside a busy worker: no error");
note "steps met: " . join(', ', map { "$_ ($met{$_})" } sort keys %met);
for my $step (@steps)
{
	ok($met{$step}, "DDL met the worker inside \"$step\" ($met{$step} times)")
	  or diag "steps met: " . join(', ', sort keys %met);
}
ok($node->log_contains('steps aside for DDL on the extension'), 'the worker stepped aside for DDL');

# the worker serves the database afterwards
$s->query_safe(q{CREATE EXTENSION pgjq; SELECT pgjq.create_queue('after')});
my $id = $s->query_safe(q{SELECT pgjq.enqueue('after', '{}', delay => '100 ms')});
ok($node->poll_query_until('d', "SELECT state = 'ready' FROM pgjq.job($id)"),
	'after the rounds the worker promotes a delayed job');
is($s->query_safe('SELECT count(*) FROM pgjq.verify()'), '0', 'shared memory and the tables agree');

$s->quit;
$node->stop;
done_testing();
