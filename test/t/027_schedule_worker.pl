
# Copyright (c) pgjq contributors
#
# The background worker fires periodic jobs: one job per slot, each slot
# once, and after a kill -9 of the postmaster the missed slots follow
# catch_up: 'all' enqueues every one of them (no gap), 'one' only the latest
# (one gap, the downtime).  No slot is ever enqueued twice.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('schedule_worker');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('tick');
SELECT pgjq.schedule('tick_all', '@every 1 second', 'tick', '{"s": "all"}', catch_up => 'all');
SELECT pgjq.schedule('tick_one', '@every 1 second', 'tick', '{"s": "one"}', catch_up => 'one');});

ok( $node->poll_query_until(
		'postgres', q{SELECT ready >= 6 FROM pgjq.queue_stats WHERE queue = 'tick'}),
	'the worker enqueues the jobs of each second');

# kill -9 of the postmaster, 3 s down, then start it again
ok(kill9_restart($node, 3), 'the server starts again after kill -9 of the postmaster');
my $restarted = time;
# three more seconds of ticks after the restart
ok( $node->poll_query_until(
		'postgres', "SELECT bool_and(last_slot > to_timestamp($restarted + 3)) FROM pgjq.list_schedules()"),
	'both schedules fired slots after the restart');

# every job's slot, by schedule, as epoch seconds
my %slots;
for (split /\n/, sql(q{SELECT payload->>'s', round(extract(epoch FROM (payload->>'pgjq_slot')::timestamptz))
                          FROM pgjq.claim('tick', 10000)}))
{
	my ($s, $t) = split /\|/;
	push @{ $slots{$s} }, $t;
}

for my $s ('all', 'one')
{
	my @t = sort { $a <=> $b } @{ $slots{$s} // [] };
	my %seen;
	my $dups = grep { $seen{$_}++ } @t;
	is($dups, 0, "$s: no slot enqueued twice (" . scalar(@t) . ' jobs)');
	my @gaps = grep { $t[$_] - $t[ $_ - 1 ] > 1 } 1 .. $#t;
	my $after = grep { $_ > $restarted } @t;
	cmp_ok($after, '>=', 2, "$s: slots after the restart are enqueued");
	if ($s eq 'all')
	{
		is(scalar(@gaps), 0, 'all: every missed slot was enqueued after the restart (no gap)');
	}
	else
	{
		is(scalar(@gaps), 1, 'one: the missed slots collapse into one (one gap: the downtime)');
		cmp_ok($gaps[0] ? $t[ $gaps[0] ] - $t[ $gaps[0] - 1 ] : 0, '>=', 3,
			'one: ... at least the 3 s of downtime long');
	}
}
PgjqTest::verify_ok($node, 'postgres', 'verify() after the crash');

$node->stop;
done_testing();
