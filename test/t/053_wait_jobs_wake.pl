
# Copyright (c) pgjq contributors
#
# wait_jobs() returns within milliseconds of the commit that finishes its
# job (test/BUGS.md, "wait_jobs wakes hundreds of milliseconds late").
#
# 0.3.0 planned pgjq's own statements with sequential scans disabled; a
# lookup that no index serves (job_done's ranges, under job(id)) then cost
# disable_cost, far above jit_above_cost, and every look of wait_jobs was
# JIT-compiled: 150-300 ms per look, so a waiter woke at the commit and
# returned that much later.
#
# Twenty trials: session B waits in wait_jobs(ARRAY[id], '10 s') (and with
# two ids, all => false); session A completes the job.  The wake-up is B's
# server clock at the end of its statement minus A's just before its
# complete.  The bound is measured in the same run: 5 ms plus five times the
# median time of A's complete itself (what the machine's load adds to any
# statement).  The median wake-up must stay under it.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $trials = 20;

my $node = PostgreSQL::Test::Cluster->new('wait_jobs_wake');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
$node->safe_psql('postgres',
	q{CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q', lease => '1 min');});

my $sa = $node->background_psql('postgres', on_error_stop => 1);
my $sb = $node->background_psql('postgres', on_error_stop => 1);
my $bpid = $sb->query_safe(q{SELECT pg_backend_pid()});

sub median
{
	my @s = sort { $a <=> $b } @_;
	return $s[ int(@s / 2) ];
}

# One trial: (ms from A's complete to B's return, ms A's complete took, B's rows)
sub trial
{
	my ($all) = @_;
	my $ids = $node->safe_psql('postgres',
		q{SELECT string_agg(pgjq.enqueue('q', '{}')::text, ',') FROM generate_series(1, 2)});
	my ($first) = split /,/, $ids;
	my $wait_ids = $all ? $first : $ids;
	my ($id, $token) = split /\|/,
	  $sa->query_safe(q{SELECT id, token FROM pgjq.claim('q') ORDER BY id LIMIT 1});
	die "A claimed $id, not $first" unless $id eq $first;

	my $marker = 'end of wait_jobs';
	$sb->{stdin} .=
	    "SELECT count(*) FILTER (WHERE state = 'completed'), "
	  . "extract(epoch FROM clock_timestamp()) "
	  . "FROM pgjq.wait_jobs(ARRAY[$wait_ids]::bigint[], '10 s', \"all\" => "
	  . ($all ? 'true' : 'false') . ");\n"
	  . "\\echo '$marker'\n";
	$sb->{run}->pump_nb();
	$node->poll_query_until('postgres',
		"SELECT wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs') FROM pg_stat_activity WHERE pid = $bpid")
	  or die 'B does not sleep';

	my $t0 = $sa->query_safe('SELECT extract(epoch FROM clock_timestamp())');
	$sa->query_safe("SELECT pgjq.complete($id, $token)");
	my $t1 = $sa->query_safe('SELECT extract(epoch FROM clock_timestamp())');

	pump_until($sb->{run}, $sb->{timeout}, \$sb->{stdout}, qr/$marker\n/)
	  or die 'B did not finish';
	my $out = $sb->{stdout};
	$out =~ s/\n?$marker\n//;
	$sb->{stdout} = '';
	my ($done, $t2) = split /\|/, $out;

	# the other job: claimed and completed, so the queue ends empty
	$sa->query_safe(q{SELECT pgjq.complete(id, token) FROM pgjq.claim('q')});
	return (($t2 - $t0) * 1000, ($t1 - $t0) * 1000, $done);
}

for my $all (1, 0)
{
	my $form = $all ? 'wait_jobs(ARRAY[id])' : 'wait_jobs(ARRAY[id, other], all => false)';
	my (@wake, @complete, @wrong);
	for my $i (1 .. $trials)
	{
		my ($wake, $complete, $done) = trial($all);
		push @wake,     $wake;
		push @complete, $complete;
		push @wrong,    "trial $i: $done completed" unless $done eq '1';
		note sprintf('%s, trial %d: returned %.2f ms after the complete began (complete: %.2f ms)',
			$form, $i, $wake, $complete);
	}
	my $bound = 5 + 5 * median(@complete);
	is(join('; ', @wrong), '', "$form: returns with the completed job, $trials trials");
	cmp_ok(median(@wake), '<=', $bound,
		sprintf('%s: median wake-up %.2f ms, within %.2f ms (5 ms + 5 x the median complete)',
			$form, median(@wake), $bound));
}

is($node->safe_psql('postgres', q{SELECT ready || '/' || running FROM pgjq.queue_stats WHERE queue = 'q'}),
	'0/0', 'every job was claimed and completed');

$sa->quit;
$sb->quit;
$node->stop;
done_testing();
