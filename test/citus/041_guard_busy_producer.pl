# Copyright (c) pgjq contributors
#
# A producer that loops enqueue_many() on one connection is fenced by a
# move (issue 35, finding 5).  Its statements queue behind the fence's
# exclusive queue-name lock with a snapshot taken before the fence
# committed; the guard used to reload the fences with that snapshot and
# cache "no fence" until the next invalidation, so the session was never
# refused, the source never emptied and the move gave up after drain_wait.
# Here one session connected to the source loops enqueue_many() (5-20 jobs a
# call) while a worker claims (keeping its claim's transaction open 50 ms,
# which the fence waits for) and completes through the coordinator, and
# CALL pgjq.move_queues() moves the queue: the producer must get PJ002
# within a second of the fence, the move must complete, and every job
# acknowledged must be completed exactly once.  The window of refusals is
# printed (diag) for the record.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqCitus;

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');
$c->safe_psql(0, q{SELECT pgjq.create_queue('busy')});
my ($shard, $src_port) = split /\|/, $c->safe_psql(0, q{SELECT shard, node_port FROM pgjq.route('busy')});
my $src = $src_port == $c->node_port(1) ? 1 : 2;
my $tgt = $src == 1 ? 2 : 1;
my $tgt_port = $c->node_port($tgt);

sub session
{
	my ($n) = @_;
	my $s = $c->node($n)->background_psql('postgres', on_error_stop => 0);
	$s->query_safe('\set VERBOSITY verbose');
	$s->set_query_timer_restart;
	return $s;
}

# (stdout, stderr) of one query in session $s
sub run_in
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	return ($out, $s->{stderr});
}

# The producer: psql reading a long script on one connection to the source
# (as route() said), one enqueue_many() of 5-20 jobs after another, 10 ms
# apart (so that the one worker keeps up: a move waits for the source to
# empty), errors and all: a process of its own, so that its next statement
# is on its way while a fence waits.
my $script = $PostgreSQL::Test::Utils::tmp_check . '/041_producer.sql';
my ($prod_out, $prod_err) = map { $PostgreSQL::Test::Utils::tmp_check . "/041_producer.$_" } 'out', 'err';
open(my $fh, '>', $script) or die "$script: $!";
print $fh "\\set VERBOSITY verbose\nSELECT 'pid ' || pg_backend_pid();\n";
printf $fh "SELECT pgjq.enqueue_many('busy', array_fill('{}'::jsonb, ARRAY[%d]));\nSELECT pg_sleep(0.01);\n",
  5 + int(rand(16))
  for 1 .. 100_000;
close($fh);
my $producer = IPC::Run::start(
	[ $c->node($src)->installed_command('psql'), '-XAtq', '-d', $c->node($src)->connstr('postgres'), '-f', $script ],
	'>', $prod_out, '2>', $prod_err);

my $worker = session(0);
my $watch = session($src);
my $mover = session(0);

my %done;
my ($fence_since, $moved_at);
my $short_completions = 0;

sub work
{
	# it claims in a transaction it keeps open a moment (as a worker that
	# does some work before it commits its claim): a fence waits for it
	my ($out, $err) = run_in($worker,
		"BEGIN;\nSELECT id, token FROM pgjq.claim('busy', 500);\nSELECT pg_sleep(0.05);\nCOMMIT;");
	return 0 if $err =~ /ERROR/;
	my (@ids, @toks);
	for (grep { /^\d+\|\d+$/ } split /\n/, $out)
	{
		my ($id, $tok) = split /\|/;
		push @ids, $id;
		push @toks, $tok;
	}
	return 0 unless @ids;
	my $sql = "SELECT pgjq.complete_in('busy', ARRAY[" . join(',', @ids) . "]::bigint[], ARRAY["
	  . join(',', @toks) . ']::bigint[])';
	# a completion refused for a moment (a move's last phase) is retried
	for (1 .. 200)
	{
		($out, $err) = run_in($worker, $sql);
		last unless $err =~ /ERROR/;
		usleep(20_000);
	}
	$short_completions++ unless $out eq scalar @ids;
	$done{$_}++ for @ids;
	return scalar @ids;
}

# load before the move
my $until = time + 2;
work() while time < $until;
cmp_ok(scalar keys %done, '>', 0, 'jobs are enqueued and completed on the source before the move');

my $move_started = time;
$mover->query_until(qr/started/,
	"\\echo started\nCALL pgjq.move_queues($shard, '127.0.0.1', $tgt_port, drain_wait => '60 s');\n\\echo moved\n");
$until = time + 120;
while (time < $until)
{
	work();
	if (!defined $fence_since)
	{
		my ($out) = run_in($watch,
			"SELECT extract(epoch FROM since) FROM pgjq.queue_fence WHERE shard = $shard");
		$fence_since = $out if $out =~ /^\d/;
	}
	$mover->{run}->pump_nb;
	if ($mover->{stdout} =~ /moved/)
	{
		$moved_at = time;
		last;
	}
}
ok(defined $moved_at, 'the move returned');
unlike($mover->{stderr}, qr/ERROR/, 'the move completed') or diag($mover->{stderr});
is($c->safe_psql(0, q{SELECT node_port FROM pgjq.route('busy')}), $tgt_port, 'the queue is served by the target');
ok(defined $fence_since, 'the fence was seen');

# enqueues go on (Citus delegates them to the target); then the producer
# stops, and every job it was told of is completed, once
$until = time + 1;
work() while time < $until;
$producer->kill_kill;
my @out = split /\n/, slurp_file($prod_out);
my ($pid) = map { /^pid (\d+)$/ ? $1 : () } @out;
my @acked = grep { /^\d+$/ } @out;
my $err = slurp_file($prod_err);
my $refused = () = $err =~ /ERROR:\s+PJ002:/g;
my %other;
$other{$1}++ while $err =~ /ERROR:\s+(\w+):/g;
delete $other{PJ002};
is(join(',', sort keys %other), '', 'no other error for the producer') or diag(explain \%other);

# the producer's refusals, as the source logged them
my @refusals = map { /^(\d{4}-\S+ \S+ \S+) \[$pid\] .*ERROR:  queue "busy" is moving/ ? $1 : () }
  split /\n/, slurp_file($c->node($src)->logfile);
ok(@refusals > 0, 'the looping producer was refused with PJ002');
if (@refusals && defined $fence_since)
{
	my ($first, $last) = split /\|/, $c->safe_psql(0,
		"SELECT extract(epoch FROM '$refusals[0]'::timestamptz), extract(epoch FROM '$refusals[-1]'::timestamptz)");
	my $lag = $first - $fence_since;
	cmp_ok($lag, '<', 1.0, 'its first PJ002 came within a second of the fence');
	diag(sprintf(
		'finding 5: first PJ002 %.3f s after the fence; producer refused for %.3f s '
		  . '(%d calls refused, %d jobs acknowledged); the move took %.3f s from its fence to its return '
		  . '(%.3f s from its CALL)',
		$lag, $last - $first, $refused, scalar(@acked),
		$moved_at - $fence_since, $moved_at - $move_started));
}

$until = time + 60;
while (time < $until && grep { !$done{$_} } @acked)
{
	work() or usleep(50_000);
}
cmp_ok(scalar @acked, '>', 0, 'the producer was told of jobs');
is(scalar(grep { !$done{$_} } @acked), 0, 'every acknowledged job was completed');
is(scalar(grep { $done{$_} > 1 } keys %done), 0, 'none twice');
is($short_completions, 0, 'every claimed job was completed by its complete_in()');
is($c->safe_psql($src, 'SELECT count(*) FROM pgjq.queue') . ' '
	  . $c->safe_psql($src, 'SELECT count(*) FROM pgjq.queue_fence'),
	'0 0', 'the source has neither the queue nor a fence');

$_->quit for $worker, $watch, $mover;
$c->stop;
done_testing();
