
# Copyright (c) pgjq contributors
#
# A rolled-back claim wakes a waiting claim, every time (test/BUGS.md, "A
# rolled-back claim does not always wake a waiting claim").
#
# One job; session A claims it in an open transaction; session B waits in
# claim(q, 1, wait => '4 s'); A rolls back.  The job is claimable again once
# A's abort has given the claim back, and B must get it then, not at the end
# of its wait.  0.2.0 woke B from an abort callback that could run before
# the ring's own abort callback gave the claim back: when B was quick (warm
# caches, from the third trial on) it looked, found the job still held,
# used up its wake-up and slept to the end of its wait (3.5 s).
#
# 20 trials in a row on the same queue and the same two connections (a
# transaction's callbacks are registered once per backend, so their order is
# fixed after the first trial), then the same with the claim in a
# savepoint that is rolled back.  Each must wake B within 200 ms of the
# rollback: B's statement end minus A's clock just before its ROLLBACK, both
# read on the server.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $trials = 20;
my $bound_ms = 200;

my $node = PostgreSQL::Test::Cluster->new('wait_rollback');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
$node->safe_psql('postgres',
	q{CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q', lease => '1 min');});

my $a = $node->background_psql('postgres', on_error_stop => 1);
my $b = $node->background_psql('postgres', on_error_stop => 1);
my $bpid = $b->query_safe('SELECT pg_backend_pid()');

# One trial: returns how long after A's ROLLBACK (ms) B's waiting claim
# returned, and how many jobs it got (it completes the one it got).
sub trial
{
	my ($savepoint) = @_;
	$node->safe_psql('postgres', q{SELECT pgjq.enqueue('q', '{}')});
	$a->query_safe('BEGIN');
	$a->query_safe('SAVEPOINT s') if $savepoint;
	my $took = $a->query_safe('SELECT count(*) FROM pgjq.claim(\'q\')');
	die "A claimed $took jobs" unless $took eq '1';

	# B waits; its output: jobs got, id, token, end of statement (epoch)
	my $marker = 'end of waiting claim';
	$b->{stdin} .=
	    "SELECT count(*), min(id), min(token), "
	  . "extract(epoch FROM clock_timestamp()) FROM pgjq.claim('q', 1, wait => '4 s');\n"
	  . "\\echo '$marker'\n";
	$b->{run}->pump_nb();
	$node->poll_query_until('postgres',
		"SELECT wait_event IN ('Extension', 'PgjqClaim', 'PgjqWaitJobs') FROM pg_stat_activity WHERE pid = $bpid")
	  or die 'B does not sleep';

	my $t0 = $a->query_safe('SELECT extract(epoch FROM clock_timestamp())');
	$a->query_safe($savepoint ? 'ROLLBACK TO SAVEPOINT s' : 'ROLLBACK');
	$a->query_safe('ROLLBACK') if $savepoint;

	pump_until($b->{run}, $b->{timeout}, \$b->{stdout}, qr/$marker\n/)
	  or die 'B did not finish';
	my $out = $b->{stdout};
	$out =~ s/\n?$marker\n//;
	$b->{stdout} = '';
	my ($n, $id, $token, $t1) = split /\|/, $out;
	$b->query_safe("SELECT pgjq.complete($id, $token)") if $n;
	return (($t1 - $t0) * 1000, $n);
}

for my $kind ('ROLLBACK', 'ROLLBACK TO SAVEPOINT')
{
	my @late;
	for my $i (1 .. $trials)
	{
		my ($ms, $n) = trial($kind ne 'ROLLBACK');
		push @late, sprintf('trial %d: %.0f ms, %d jobs', $i, $ms, $n)
		  if $ms > $bound_ms || $n != 1;
		note sprintf('%s, trial %d: woken %.1f ms after it, %d jobs', $kind, $i, $ms, $n);
	}
	is(join('; ', @late), '',
		"$kind of a claim wakes the waiting claim within $bound_ms ms, $trials trials in a row"
	);
}

is($node->safe_psql('postgres', q{SELECT ready || '/' || running FROM pgjq.queue_stats WHERE queue = 'q'}),
	'0/0', 'every job was claimed and completed');

$a->quit;
$b->quit;
$node->stop;
done_testing();
