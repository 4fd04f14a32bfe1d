# Copyright (c) pgjq contributors
#
# A move carries the queue whole and loses nothing (issue 35, review 0.4.0
# C3, H2, M3, M5, L3, L5; test notes T3, T5, T6): a dedup_for key, a key
# hold, a dead job and a schedule with its next slot go to the target; a
# promotion that committed but has not published its jobs when the move
# looks is waited for; the release refuses a queue that still holds a job
# (the job stays, the fence too); a move back after a move cut short
# leaves no fence behind; two moves of a shard at once, a non-superuser's
# move, and a paused queue with jobs are refused up front; a leftover copy
# on the target takes the source's settings.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IPC::Run;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqCitus;

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
my %port = map { $_ => $c->node_port($_) } 0, 1, 2;
my %n_of_port = map { $port{$_} => $_ } 0, 1, 2;
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');

# queue names in routing shards of their own, one per scenario
my %used;
sub queue_alone
{
	my ($prefix) = @_;
	for my $i (1 .. 500)
	{
		my $q = "$prefix$i";
		my $shard = $c->safe_psql(0, "SELECT shard FROM pgjq.route('$q')");
		next if $used{$shard}++;
		$c->safe_psql(0, "SELECT pgjq.create_queue('$q', max_attempts => 1)");
		my ($s, $home) = split /\|/, $c->safe_psql(0, "SELECT shard, node_port FROM pgjq.route('$q')");
		my $other = $home == $port{1} ? $port{2} : $port{1};
		return ($q, $s, $n_of_port{$home}, $n_of_port{$other});
	}
	die "no free routing shard for $prefix";
}
sub move
{
	my ($shard, $to, %o) = @_;
	my $wait = $o{drain_wait} // '30 s';
	return $c->psql(0, "CALL pgjq.move_queues($shard, '127.0.0.1', $port{$to}, drain_wait => '$wait')");
}
sub fences
{
	my ($shard) = @_;
	return join ' ', map { $c->safe_psql($_, "SELECT count(*) FROM pgjq.queue_fence WHERE shard = $shard") } 0, 1, 2;
}
sub poll
{
	my ($n, $sql, $want, $secs) = @_;
	my $until = time + ($secs // 30);
	while (time < $until)
	{
		my $got = $c->safe_psql($n, $sql);
		return 1 if $got eq $want;
		usleep(100_000);
	}
	return 0;
}
# the id guard serves an id issued by another node once this node holds the
# job (the guard's side of issue 35): until then, calls naming a carried
# dead job's id on the target are refused with PJ001

# ------------------------------------------------ carried: dedup, hold, dead, schedule

my ($qc, $sc, $hc, $oc) = queue_alone('qc');
my $j1 = $c->safe_psql(0, "SELECT pgjq.enqueue('$qc', '{}', dedup_key => 'user42', dedup_for => '1 day')");
my ($id, $tok) = split /\|/, $c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qc')");
is($id, $j1, 'the dedup_for job claimed');
$c->safe_psql(0, "SELECT pgjq.complete_in('$qc', '{$id}', '{$tok}')");
my $dead = $c->safe_psql(0, "SELECT pgjq.enqueue('$qc', '{\"d\": 1}')");
($id, $tok) = split /\|/, $c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qc')");
is($c->safe_psql(0, "SELECT pgjq.fail_in('$qc', $id, $tok, 'no')"), 'dead', 'a dead job');
$c->safe_psql(0, "SELECT pgjq.hold_key('$qc', 'k', now() + interval '1 hour')");

# a schedule on the queue's node; its first slot fired and done, so that
# the move (a second or two) runs well before the next one
$c->safe_psql($hc, "SELECT pgjq.schedule('tick', '\@every 10 seconds', '$qc', '{\"s\": 1}')");
my $slot_job;
my $until = time + 30;
while (time < $until && !$slot_job)
{
	my $r = $c->safe_psql($hc, "SELECT id || '|' || token FROM pgjq.claim('$qc') WHERE payload ? 'pgjq_slot'");
	if ($r ne '')
	{
		$slot_job = $r;
		my ($sid, $stok) = split /\|/, $r;
		$c->safe_psql(0, "SELECT pgjq.complete_in('$qc', '{$sid}', '{$stok}')");
		last;
	}
	usleep(100_000);
}
ok($slot_job, 'the schedule fired on the source');
my $next_slot = $c->safe_psql($hc, q{SELECT next_slot FROM pgjq.schedules WHERE name = 'tick'});
my $log_offset = -s $c->node($hc)->logfile;

my ($rc, $out, $err) = move($sc, $oc);
is($rc, 0, 'the move with a dedup_for key, a key hold, a dead job and a schedule') or diag $err;
is(fences($sc), '0 0 0', 'no fence left');
is($c->safe_psql(0, "SELECT node_port FROM pgjq.route('$qc')"), $port{$oc}, 'the queue is served on the target');

is($c->safe_psql(0, "SELECT pgjq.enqueue('$qc', '{}', dedup_key => 'user42', dedup_for => '1 day')"), $j1,
	'dedup_for: a duplicate after the move gets the first id (H2)');
my $kid = $c->safe_psql(0, "SELECT pgjq.enqueue('$qc', '{}', fair_key => 'k')");
is($c->safe_psql($oc, "SELECT count(*) FROM pgjq.claim('$qc', 10) WHERE id = $kid"), 0,
	'the held key: its job is not claimed on the target (H2)');
is($c->safe_psql($oc, "SELECT count(*) FROM pgjq.key_holds WHERE fair_key = 'k' AND until > now() + interval '50 minutes'"), 1,
	'the hold is the source\'s, with its end');

# the id guard serves an id another node issued where the job is held
($rc, $out, $err) = $c->psql(0, "SELECT state FROM pgjq.job_in('$qc', $dead)");
is($out, 'dead', 'job_in: the dead job on the target, same id') or diag $err;
is($c->safe_psql(0, "SELECT pgjq.retry_dead('$qc')"), 1, 'retry_dead on the target takes the carried dead job');
($id, $tok) = split /\|/, $c->safe_psql($oc, "SELECT id, token FROM pgjq.claim('$qc', 10) WHERE id = $dead");
is($id, $dead, 'and it is claimed there, same id');
($rc, $out, $err) = $c->psql(0, "SELECT pgjq.complete_in('$qc', '{$dead}', '{$tok}')");
is($out, 1, 'and completed') or diag $err;
is($c->safe_psql($hc, "SELECT count(*) FROM pgjq.job_history WHERE id = $dead"), 0, 'the source kept no copy of the dead job');

# the schedule: on the target with its next slot, fired there, gone from the source
is($c->safe_psql($hc, 'SELECT count(*) FROM pgjq.list_schedules()'), 0, 'list_schedules() on the source is empty (C2)');
ok( poll($oc, "SELECT count(*) FROM pgjq.schedules WHERE name = 'tick' AND last_slot >= '$next_slot'", 1, 25),
	'the schedule fires on the target from the slot it had on the source');
is($c->safe_psql($oc, "SELECT count(*) FROM pgjq.schedules WHERE name = 'tick' AND last_slot < '$next_slot'"), 0,
	'no slot fired twice');
my $log = slurp_file($c->node($hc)->logfile, $log_offset);
unlike($log, qr/does not exist; \d+ slot\(s\) skipped/, 'the source skipped no slot (C2)');
$c->safe_psql($oc, q{SELECT pgjq.unschedule('tick')});

# --------------------------------------------------- the promotion window (C3(a))

# a delayed job due now, promoted by a session whose commit callbacks wait
# 3 s after its commit (rows gone from pgjq.job, not yet in the ring); the
# worker of that node is stopped so that it does not promote the job first
my ($qp, $sp, $hp, $op) = queue_alone('qp');
$c->safe_psql($hp, q{ALTER SYSTEM SET pgjq.database_names = ''});
$c->node($hp)->reload;
ok(poll($hp, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker'}, 0), 'no worker on the source');
my $d = $c->safe_psql(0, "SELECT pgjq.enqueue('$qp', '{}', delay => '1 second')");
usleep(1_200_000);
my $promote_log = -s $c->node($hp)->logfile;
my ($pout, $perr) = ('', '');
my $promoter = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $c->node($hp)->host, '-p', $port{$hp}, '-d', 'postgres',
		'-c', "SET pgjq.debug_pause_at = 'commit'; SELECT pgjq.promote()" ],
	'>', \$pout, '2>', \$perr);
$until = time + 20;
usleep(50_000) while time < $until && slurp_file($c->node($hp)->logfile, $promote_log) !~ /pausing at point "commit"/;
my ($mout, $merr) = ('', '');
my $mover = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $c->node(0)->host, '-p', $port{0}, '-d', 'postgres',
		'-c', "CALL pgjq.move_queues($sp, '127.0.0.1', $port{$op}, drain_wait => '20 s')" ],
	'>', \$mout, '2>', \$merr);
my $got;
$until = time + 25;
while (time < $until && !$got)
{
	my ($r1, $o1, $e1) = $c->psql(0, "SELECT id, token FROM pgjq.claim('$qp')");
	$got = $o1 if $r1 == 0 && $o1 ne '';
	usleep(100_000);
}
($id, $tok) = split /\|/, ($got // '');
is($id, $d, 'the job promoted during the move is claimable (C3(a))');
is($c->safe_psql(0, "SELECT pgjq.complete_in('$qp', '{$id}', '{$tok}')"), 1, 'and completed') if $got;
$promoter->finish;
$mover->finish;
is(($mover->full_result(0) // 0) >> 8, 0, 'the move finished') or diag $merr;
is(fences($sp), '0 0 0', 'no fence left');
$c->safe_psql($hp, q{ALTER SYSTEM RESET pgjq.database_names});
$c->node($hp)->reload;

# -------------------------------------- the release refuses a queue with a job (C3)

# a move driven by hand to its switch; then a job reaches the source's copy
# (the guard off, as a superuser's repair could)
my ($qr, $sr, $hr, $or) = queue_alone('qr');
my $g_or = $c->safe_psql(0, "SELECT groupid FROM pg_dist_node WHERE nodeport = $port{$or}");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$hr}, 'SELECT pgjq._citus_fence($sr, $g_or, ''f'')')");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$or}, 'SELECT pgjq._citus_adopt_queues('
	|| quote_literal(pgjq._citus_on('127.0.0.1', $port{$hr}, 'SELECT pgjq._citus_shard_queues($sr)')) || ')')");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$hr}, 'SELECT pgjq._citus_fence($sr, $g_or, ''s'')')");
$c->safe_psql(0, "SELECT citus_move_shard_placement($sr, '127.0.0.1', $port{$hr}, '127.0.0.1', $port{$or}, "
	  . "shard_transfer_mode := 'block_writes')");
# (from PL/pgSQL: Citus does not delegate the call)
my $late = $c->safe_psql($hr, "SET pgjq.citus_guard = off;
	DO \$\$ BEGIN PERFORM set_config('test.late', pgjq.enqueue('$qr', '{}')::text, false); END \$\$;
	SELECT current_setting('test.late')");
$c->fails_with($hr, "SELECT pgjq._citus_release_queues($sr)", '55006',
	qr/the queues of routing shard $sr still hold 1 live jobs here: nothing is dropped/, 'the release of a queue with a job');
is($c->safe_psql($hr, "SET pgjq.citus_guard = off; SELECT state FROM pgjq.job($late)"), 'ready', 'the job is still there');
is($c->safe_psql($hr, "SELECT state FROM pgjq.queue_fence WHERE shard = $sr"), 's', 'and the fence');
$c->fails_with(0, "CALL pgjq.move_queues($sr, '127.0.0.1', $port{$or})", '55006',
	qr/still hold 1 live jobs here: nothing is dropped/, 'move_queues() finishing that move stops too');
is($c->safe_psql($hr, "SET pgjq.citus_guard = off; SELECT state FROM pgjq.job($late)"), 'ready', 'the job is still there');
# once the job is done there, calling it again finishes the move
($id, $tok) = split /\|/, $c->safe_psql($hr, "SET pgjq.citus_guard = off;
	DO \$\$ BEGIN PERFORM set_config('test.claimed', (SELECT c.id || '|' || c.token FROM pgjq.claim('$qr') c), false); END \$\$;
	SELECT current_setting('test.claimed')");
$c->safe_psql($hr, "SET pgjq.citus_guard = off; SELECT pgjq.complete('{$id}'::bigint[], '{$tok}'::bigint[])");
($rc, $out, $err) = move($sr, $or);
is($rc, 0, 'then move_queues() finishes the move') or diag $err;
is(fences($sr), '0 0 0', 'no fence left');
is($c->safe_psql($hr, "SELECT count(*) FROM pgjq.queue WHERE name = '$qr'"), 0, 'the source\'s copy is dropped');

# ---------------------- the shard moved behind pgjq's back mid-move (C3(b))

# a held job keeps the drain busy; meanwhile the shard is moved with Citus
# alone and jobs are enqueued on the target's copy: when the drain gives
# up, the target's queues must not be dropped
my ($qb, $sb, $hb, $ob) = queue_alone('qb');
my ($bid, $btok) = split /\|/, do {
	$c->safe_psql(0, "SELECT pgjq.enqueue('$qb', '{}')");
	$c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qb', lease => '2 minutes')");
};
my ($bout, $berr) = ('', '');
my $bmove = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $c->node(0)->host, '-p', $port{0}, '-d', 'postgres',
		'-c', "CALL pgjq.move_queues($sb, '127.0.0.1', $port{$ob}, drain_wait => '6 s')" ],
	'>', \$bout, '2>', \$berr);
ok(poll($ob, "SELECT count(*) FROM pgjq.queue WHERE name = '$qb'", 1, 10), 'the move made its copy on the target');
$c->safe_psql(0, "SELECT citus_move_shard_placement($sb, '127.0.0.1', $port{$hb}, '127.0.0.1', $port{$ob}, "
	  . "shard_transfer_mode := 'block_writes')");
my @behind = map { $c->safe_psql(0, "SELECT pgjq.enqueue('$qb', '{}')") } 1 .. 3;
$bmove->finish;
like($berr, qr/routing shard $sb was moved to group \d+ outside move_queues\(\) while its queues on 127\.0\.0\.1:$port{$hb} were drained: nothing is dropped/,
	'the drain gives up without dropping the queues of the node that holds the shard (C3(b))');
is($c->safe_psql($ob, "SELECT count(*) FROM pgjq.claim('$qb', 10)"), 3, 'the 3 jobs enqueued there are claimable');
# the held job finished on the old node (outcomes are served under the
# fence); then the move called again toward the shard's node finishes
$c->safe_psql($hb, "SELECT pgjq.complete('{$bid}'::bigint[], '{$btok}'::bigint[])");
($rc, $out, $err) = move($sb, $ob);
is($rc, 0, 'then move_queues() finishes the move') or diag $err;
is(fences($sb), '0 0 0', 'no fence left');

# --------------------------------------------- a move back after a move cut short (M3)

my ($qm, $sm, $hm, $om) = queue_alone('qm');
my $g_om = $c->safe_psql(0, "SELECT groupid FROM pg_dist_node WHERE nodeport = $port{$om}");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$hm}, 'SELECT pgjq._citus_fence($sm, $g_om, ''s'')')");
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$om}, 'SELECT pgjq._citus_adopt_queues('
	|| quote_literal(pgjq._citus_on('127.0.0.1', $port{$hm}, 'SELECT pgjq._citus_shard_queues($sm)')) || ')')");
$c->safe_psql(0, "SELECT citus_move_shard_placement($sm, '127.0.0.1', $port{$hm}, '127.0.0.1', $port{$om}, "
	  . "shard_transfer_mode := 'block_writes')");
($rc, $out, $err) = move($sm, $hm);
is($rc, 0, 'a move back after a move cut short after its switch') or diag $err;
is($c->safe_psql(0, "SELECT node_port FROM pgjq.route('$qm')"), $port{$hm}, 'the queue is back');
is(fences($sm), '0 0 0', 'no fence left anywhere (M3)');
like($c->safe_psql(0, "SELECT pgjq.enqueue('$qm', '{}')"), qr/^\d+$/, 'enqueues are taken after the move back');
($id, $tok) = split /\|/, $c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qm')");
is($c->safe_psql(0, "SELECT pgjq.complete_in('$qm', '{$id}', '{$tok}')"), 1, 'and claims');

# ------------------------------------ two moves of a shard at once (M3), L5, M5, L3

my ($qk, $sk, $hk, $ok_) = queue_alone('qk');
my $held = $c->safe_psql(0, "SELECT pgjq.enqueue('$qk', '{}')");
my $claimed = $c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qk', lease => '1 minute')");
my ($m1out, $m1err) = ('', '');
my $first = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $c->node(0)->host, '-p', $port{0}, '-d', 'postgres',
		'-c', "CALL pgjq.move_queues($sk, '127.0.0.1', $port{$ok_}, drain_wait => '4 s')" ],
	'>', \$m1out, '2>', \$m1err);
ok(poll($hk, "SELECT count(*) FROM pgjq.queue_fence WHERE shard = $sk", 1, 10), 'a first move has fenced');
$c->fails_with(0, "CALL pgjq.move_queues($sk, '127.0.0.1', $port{$ok_})", '55006',
	qr/routing shard $sk is being moved by another move_queues\(\) call/, 'a second move of the shard at once (M3)');
$first->finish;
like($m1err, qr/nothing moved/, 'the first move gave up (its job held)');
is(fences($sk), '0 0 0', 'no fence left');
($id, $tok) = split /\|/, $claimed;
$c->safe_psql(0, "SELECT pgjq.complete_in('$qk', '{$id}', '{$tok}')");

# L5: a paused queue with jobs is refused up front, before any fence
$c->safe_psql(0, "SELECT pgjq.enqueue('$qk', '{}')");
$c->safe_psql(0, "SELECT pgjq.pause('$qk')");
$c->fails_with(0, "CALL pgjq.move_queues($sk, '127.0.0.1', $port{$ok_})", '55006',
	qr/the queues of routing shard $sk cannot drain: queue $qk is paused/, 'a paused queue with jobs (L5)');
is(fences($sk), '0 0 0', 'no fence');
$c->safe_psql(0, "SELECT pgjq.resume('$qk')");
($id, $tok) = split /\|/, $c->safe_psql(0, "SELECT id, token FROM pgjq.claim('$qk')");
$c->safe_psql(0, "SELECT pgjq.complete_in('$qk', '{$id}', '{$tok}')");

# M5: a member of pgjq_admin who is not a superuser
$c->safe_psql(0, 'CREATE ROLE mover LOGIN; GRANT pgjq_admin TO mover');
$c->fails_with(0, "SET ROLE mover;\nCALL pgjq.move_queues($sk, '127.0.0.1', $port{$ok_})", '42501',
	qr/move_queues\(\) is for a superuser/, 'move_queues() by a non-superuser (M5)');
is(fences($sk), '0 0 0', 'no fence left');
$c->fails_with(0, "SET ROLE mover;\nSELECT * FROM pgjq.citus_setup(8)", '42501',
	qr/citus_setup\(\) is for a superuser/, 'citus_setup() by a non-superuser (M5)');

# L3: a copy left on the target by an earlier move takes the source's settings
$c->safe_psql(0, "SELECT pgjq._citus_on('127.0.0.1', $port{$ok_}, 'SELECT pgjq._citus_adopt_queues('
	|| quote_literal(pgjq._citus_on('127.0.0.1', $port{$hk}, 'SELECT pgjq._citus_shard_queues($sk)')) || ')')");
$c->safe_psql(0, "SELECT pgjq.alter_queue('$qk', concurrency => 3, lease => '7 s')");
$c->safe_psql(0, "SELECT pgjq.pause('$qk')");
($rc, $out, $err) = move($sk, $ok_);
is($rc, 0, 'a move onto a leftover copy') or diag $err;
is($c->safe_psql($ok_, "SELECT concurrency || ' ' || lease || ' ' || paused FROM pgjq.queue WHERE name = '$qk'"),
	'3 00:00:07 true', 'the copy has the source\'s settings and paused state (L3)');

$c->stop;
done_testing();
