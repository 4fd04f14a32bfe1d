# Copyright (c) pgjq contributors
#
# The guard reads fences and placements as they are now, not as the
# caller's snapshot saw them, and refuses what a move would lose.  A move's
# steps are driven by hand on queues each alone in its routing shard (as
# 030_errors.pl does), with sessions that keep their connection:
#   - a REPEATABLE READ producer on the source whose snapshot predates the
#     move (review 0.4.0 C1);
#   - a READ COMMITTED statement that started before the fence and enqueues
#     after it (C1);
#   - a claimer on the source that waited on the release step's lock, then
#     claims again on the same connection (H1);
#   - calls that change a queue on the source: "moving" (PJ002) under a
#     fence, "served by" the target (PJ001) after the switch (H3, C2);
#   - complete_and_claim() under the fence's last phase keeps its
#     completions (M4);
#   - a node whose id sequence is outside its group's range is refused (M2);
#   - the id guard serves a job held here that another node issued;
#   - more fences than the guard keeps, and a Citus of another major
#     version, are refused (L6, L1).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqCitus;

plan skip_all => citus_skip_reason() unless citus_available();

my $c = citus_cluster();
$c->safe_psql(0, 'SELECT * FROM pgjq.citus_setup(8)');

my %group_of_port = map { split /\|/ } split /\n/,
  $c->safe_psql(0, q{SELECT nodeport, groupid FROM pg_dist_node});
my %n_of_port = map { $c->node_port($_) => $_ } 0, 1, 2;

# queues each alone in its routing shard: name => {shard, src, tgt, ...}
my @slots = map { [ split /\|/ ] } split /\n/, $c->safe_psql(0, q{
	SELECT DISTINCT ON (x.shard) x.name, x.shard, n.nodeport
	  FROM (SELECT 'q' || i AS name, i,
				   get_shard_id_for_distribution_column('pgjq.queue_route', 'q' || i) AS shard
			  FROM generate_series(1, 200) i) x
	  JOIN pg_dist_placement p ON p.shardid = x.shard
	  JOIN pg_dist_node n ON n.groupid = p.groupid
	 ORDER BY x.shard, x.i});
cmp_ok(scalar @slots, '>=', 5, 'five routing shards to move');

sub queue
{
	my ($slot) = @_;
	my ($name, $shard, $port) = @$slot;
	my $src = $n_of_port{$port};
	my $tgt = $src == 1 ? 2 : 1;
	my $q = {
		name => $name,
		shard => $shard,
		src => $src,
		tgt => $tgt,
		tgt_port => $c->node_port($tgt),
		tgt_group => $group_of_port{ $c->node_port($tgt) },
	};
	$c->safe_psql(0, "SELECT pgjq.create_queue('$name')");
	return $q;
}

# the move's steps, by hand
sub fence
{
	my ($q, $state) = @_;
	$c->safe_psql($q->{src}, "SELECT pgjq._citus_fence($q->{shard}, $q->{tgt_group}, '$state')");
}

sub adopt
{
	my ($q) = @_;
	my $json = $c->safe_psql($q->{src}, "SELECT pgjq._citus_shard_queues($q->{shard})");
	$c->safe_psql($q->{tgt}, "SELECT pgjq._citus_adopt_queues(\$j\$$json\$j\$)");
}

sub switch
{
	my ($q) = @_;
	my ($sp, $tp) = ($c->node_port($q->{src}), $q->{tgt_port});
	$c->safe_psql(0,
		"SELECT citus_move_shard_placement($q->{shard}, '127.0.0.1', $sp, '127.0.0.1', $tp, "
		  . "shard_transfer_mode := 'block_writes')");
}

sub release
{
	my ($q) = @_;
	$c->safe_psql($q->{src}, "SELECT pgjq._citus_release_queues($q->{shard})");
}

# a session that keeps its connection, printing SQLSTATEs
sub session
{
	my ($n) = @_;
	my $s = $c->node($n)->background_psql('postgres', on_error_stop => 0);
	$s->query_safe('\set VERBOSITY verbose');
	return $s;
}

# $s runs $sql; returns (stdout, stderr) of that one query
sub run_in
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	return ($out, $s->{stderr});
}

sub wait_for_lock_wait
{
	my ($n, $pid) = @_;
	return $c->node($n)->poll_query_until('postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid");
}

# $sql run on node $n from PL/pgSQL, which Citus does not delegate to the
# node that holds the queue (a direct SELECT of a queue-first function is,
# with constant arguments): fails with that SQLSTATE and message
sub fails_here
{
	my ($n, $sql, $state, $re, $what) = @_;
	return $c->fails_with($n, "DO \$\$BEGIN PERFORM $sql; END\$\$", $state, $re, $what);
}

my $pj001 = qr/ERROR:\s+PJ001:/;
my $pj002 = qr/ERROR:\s+PJ002:/;

# ------------------------------------------ C1: a REPEATABLE READ producer

{
	my $q = queue($slots[0]);
	my $p = session($q->{src});
	$p->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	$p->query_safe('SELECT 1');    # its snapshot: before the move
	fence($q, 'f');
	adopt($q);
	fence($q, 's');
	switch($q);
	# from PL/pgSQL: Citus does not delegate the call, it runs here (a
	# direct SELECT with constants is delegated; Citus 13.2.2's deparser
	# crashes the backend on one with a FROM clause in this transaction)
	my ($out, $err) = run_in($p, "DO \$\$BEGIN RAISE NOTICE 'id %', pgjq.enqueue('$q->{name}', '{}'); END\$\$");
	unlike($err, qr/NOTICE:.*id \d+/, 'C1 (REPEATABLE READ): no id for an enqueue on the source after the switch');
	like($err, qr/ERROR:\s+PJ00[12]:/, 'C1 (REPEATABLE READ): refused with PJ001 or PJ002')
	  or diag($err);
	like($err, qr/queue "$q->{name}" is (served by node 127\.0\.0\.1:$q->{tgt_port}|moving)/,
		'C1 (REPEATABLE READ): the message');
	$p->query('ROLLBACK');
	$p->quit;
	release($q);
	like($c->safe_psql(0, "SELECT pgjq.enqueue('$q->{name}', '{}')"), qr/^\d+$/,
		'C1 (REPEATABLE READ): enqueues are served on the target');
}

# ----------------------------- C1: a READ COMMITTED statement that waited

{
	my $q = queue($slots[1]);
	my $p = session($q->{src});
	my $pid = $p->query_safe('SELECT pg_backend_pid()');
	$p->query_until(qr/started/,
		"\\echo started\nSELECT pgjq.enqueue('$q->{name}', x) FROM (SELECT pg_sleep(3), '{}'::jsonb AS x) s;\n");
	$c->node($q->{src})->poll_query_until('postgres',
		"SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $pid")
	  or die 'the statement did not start';
	fence($q, 'f');
	my ($out, $err) = run_in($p, 'SELECT 1');
	like($err, $pj002, 'C1 (READ COMMITTED): a statement older than the fence is refused with PJ002')
	  or diag("out: $out\nerr: $err");
	like($err, qr/queue "$q->{name}" is moving to another node/, 'C1 (READ COMMITTED): the message');
	is($c->safe_psql($q->{src}, "SELECT (pgjq._citus_shard_jobs($q->{shard}))->>'unfinished'"), '0',
		'C1 (READ COMMITTED): the source holds no job');
	$p->quit;
	$c->safe_psql($q->{src}, "SELECT pgjq._citus_unfence($q->{shard})");
}

# ------------------------- H1: a claimer that waited on the release's lock

{
	my $q = queue($slots[2]);
	my $w = session($q->{src});
	my $wpid = $w->query_safe('SELECT pg_backend_pid()');
	# claim(queues[]): not delegated by Citus, as a worker connected here
	$w->query_safe("SELECT count(*) FROM pgjq.claim(ARRAY['$q->{name}'])");    # its cache is loaded
	fence($q, 'f');
	adopt($q);
	fence($q, 's');
	switch($q);
	my $l = session($q->{src});
	$l->query_safe('BEGIN');
	$l->query_safe("SELECT pgjq._citus_release_queues($q->{shard})");
	$w->query_until(qr/started/, "\\echo started\nSELECT count(*) FROM pgjq.claim(ARRAY['$q->{name}']);\n");
	ok(wait_for_lock_wait($q->{src}, $wpid), 'H1: the claim waits on the release');
	$l->query_safe('COMMIT');
	$l->quit;
	my ($out, $err) = run_in($w, 'SELECT 1');    # the first claim's answer
	like($err, $pj001, 'H1: the claim that waited on the release gets PJ001') or diag($err);
	($out, $err) = run_in($w, "SELECT count(*) FROM pgjq.claim(ARRAY['$q->{name}'])");
	like($err, $pj001, 'H1: the second claim on the same connection gets PJ001') or diag($err);
	like($err, qr/queue "$q->{name}" is served by node 127\.0\.0\.1:$q->{tgt_port}, not by this one/,
		'H1: naming the target');
	$w->quit;
}

# --------------- H3, C2, M4: calls that change a queue, and the last phase

{
	my $q = queue($slots[3]);
	my $name = $q->{name};
	$c->safe_psql(0, "SELECT pgjq.enqueue('$name', '{}')");
	my ($id, $tok) = split /\|/, $c->safe_psql($q->{src}, "SELECT id, token FROM pgjq.claim('$name')");
	$c->safe_psql($q->{src}, "SELECT pgjq.schedule('nightly', '0 3 * * *', '$name')");
	fence($q, 'f');
	adopt($q);

	# under the fence, before the switch: a change here would not reach
	# the target's copy (made from this one's settings at the fence)
	$c->fails_with($q->{src}, "SELECT pgjq.pause('$name')", 'PJ002', qr/queue "$name" is moving to another node/,
		'H3: pause() on the fenced source');
	$c->fails_with($q->{src}, "SELECT pgjq.alter_queue('$name', concurrency => 3)", 'PJ002',
		qr/queue "$name" is moving to another node/, 'H3: alter_queue() on the fenced source');
	$c->fails_with($q->{src}, "SELECT pgjq.hold_key('$name', 'k', now() + interval '1 hour')", 'PJ002',
		qr/queue "$name" is moving to another node/, 'H3: hold_key() on the fenced source');
	$c->fails_with($q->{src}, "SELECT pgjq.schedule('tick', '* * * * *', '$name')", 'PJ002',
		qr/queue "$name" is moving to another node/, 'C2: schedule() on the fenced source');
	is($c->safe_psql($q->{src}, 'SELECT string_agg(name, \',\') FROM pgjq.list_schedules()'), 'nightly',
		'C2: no schedule was made');
	$c->fails_with($q->{src}, "SELECT pgjq.unschedule('nightly')", 'PJ002',
		qr/queue "$name" is moving to another node/, 'unschedule() of a schedule of the fenced source\'s queue');
	like($c->safe_psql($q->{src}, "SELECT count(*) FROM pgjq.metrics('$name')"), qr/^\d+$/,
		'metrics(queue) is still served on the source');

	# M4: the last phase refuses claims; a cycle keeps its completions
	fence($q, 's');
	my ($rc, $out, $err) = $c->psql($q->{src},
		"\\set VERBOSITY verbose\nSELECT count(*) FROM pgjq.complete_and_claim('$name', ARRAY[$id]::bigint[], ARRAY[$tok]::bigint[])");
	is($rc, 0, 'M4: complete_and_claim() under the last phase is served') or diag($err);
	is($out, '0', 'M4: it claims nothing');
	is($c->safe_psql($q->{src}, "SELECT state FROM pgjq.job($id)"), 'completed', 'M4: the job is completed');
	$c->fails_with($q->{src}, "SELECT count(*) FROM pgjq.claim('$name')", 'PJ002',
		qr/queue "$name" is moving to another node/, 'a claim under the last phase');

	# H3: after the switch (the release not run yet), the source's copy is
	# not the queue
	switch($q);
	my $port = $q->{tgt_port};
	my $served_by = qr/queue "$name" is served by node 127\.0\.0\.1:$port, not by this one/;
	fails_here($q->{src}, "pgjq.pause('$name')", 'PJ001', $served_by, 'H3: pause() on the source after the switch');
	fails_here($q->{src}, "pgjq.hold_key('$name', 'k', now() + interval '1 hour')", 'PJ001', $served_by,
		'H3: hold_key() on the source after the switch');
	fails_here($q->{src}, "pgjq.drop_queue('$name')", 'PJ001', $served_by, 'H3: drop_queue() on the source after the switch');
	fails_here($q->{src}, "pgjq.alter_queue('$name', concurrency => 3)", 'PJ001', $served_by,
		'H3: alter_queue() on the source after the switch');
	fails_here($q->{src}, "pgjq.cancel_key('$name', 'k')", 'PJ001', $served_by, 'cancel_key() on the source after the switch');
	fails_here($q->{src}, "count(*) FROM pgjq.metrics('$name')", 'PJ001', $served_by,
		'metrics(queue) on the source after the switch');
	# enqueues and claims: "moving" until the move drops the fence (a
	# coordinator may have delegated them on the metadata of a moment
	# before: a retry through it reaches the target); PJ001 after (H1)
	my $moving = qr/queue "$name" is moving to another node/;
	fails_here($q->{src}, "pgjq.enqueue('$name', '{}')", 'PJ002', $moving, 'an enqueue on the source after the switch');
	fails_here($q->{src}, "count(*) FROM pgjq.claim(ARRAY['$name'])", 'PJ002', $moving, 'a claim on the source after the switch');
	is($c->safe_psql($q->{src}, "SELECT pgjq.unschedule('nightly')"), 't',
		'unschedule() on the source after the switch: a schedule left there stays removable');
	is($c->safe_psql($q->{tgt}, "SELECT paused FROM pgjq.queue_stats WHERE queue = '$name'"), 'f',
		'H3: the target\'s queue is not paused');
	is($c->safe_psql($q->{tgt}, "SELECT count(*) FROM pgjq.queue WHERE name = '$name'"), '1',
		'H3: the target\'s queue is there');
	release($q);
	fails_here($q->{src}, "pgjq.enqueue('$name', '{}')", 'PJ001', $served_by, 'an enqueue on the source after the move');
	$c->safe_psql(0, "SELECT pgjq.pause('$name')");
	is($c->safe_psql($q->{tgt}, "SELECT paused FROM pgjq.queue_stats WHERE queue = '$name'"), 't',
		'pause() through the coordinator reaches the target');
}

# ---------------------------------------- M2: a node outside its id range

{
	my $q = queue($slots[4]);
	my $n = $q->{src};
	$c->safe_psql($n, 'ALTER SEQUENCE pgjq.job_id_seq RESTART 5');
	$c->fails_with($n, "SELECT pgjq.enqueue('$q->{name}', '{}')", '55000',
		qr/this node's job ids are not in the range of its node group/, 'M2: an enqueue on a node without its id range');
	$c->safe_psql($n, 'SELECT pgjq._citus_node_setup()');
	like($c->safe_psql($n, "SELECT pgjq.enqueue('$q->{name}', '{}')"), qr/^\d{15,}$/,
		'M2: served again once the node has its range');
}

# ----------------- the id guard: a job held here that another node issued

{
	my $name = $slots[0][0];    # moved above: served by its target now
	my $port = $c->safe_psql(0, "SELECT node_port FROM pgjq.route('$name')");
	my $here = $n_of_port{$port};
	my $issuer = $here == 1 ? 2 : 1;
	my $issuer_port = $c->node_port($issuer);
	# a job a move carried here keeps the id its first node issued: one made
	# here as such a job would be, with an id of the other node's range
	my $id = $c->safe_psql($here,
		"SET pgjq.citus_guard = off;\nSELECT pgjq.enqueue('$name', '{}', delay => '1 hour')");
	my $cid = $c->safe_psql(0, "SELECT (($group_of_port{$issuer_port} + 1)::bigint << 48) + 999999");
	$c->safe_psql($here, "UPDATE pgjq.job SET id = $cid WHERE id = $id");
	is($c->safe_psql($here, "SELECT state FROM pgjq.job($cid)"), 'scheduled',
		'the id guard serves a job held here that another node issued');
	is($c->safe_psql($here, "SELECT pgjq.cancel($cid)"), 't', 'and its outcomes');
	is($c->safe_psql($here, "SELECT state FROM pgjq.job($cid)"), 'cancelled', 'a cancelled job is held here too');
	$c->fails_with(0, "SELECT * FROM pgjq.job($cid)", 'PJ001',
		qr/job $cid was issued by node 127\.0\.0\.1:$issuer_port, not by this one/,
		'an id another node issued is refused where the job is not held');
}

# ------------------------------------------------ L6: the guard's bounds

$c->safe_psql(1,
	q{INSERT INTO pgjq.queue_fence (shard, target_group, state) SELECT -g, 0, 'f' FROM generate_series(1, 1025) g});
$c->fails_with(1, q{SELECT * FROM pgjq.route('x')}, '54000', qr/this node has more than 1024 fenced routing shards/,
	'L6: more fences than the guard keeps');
$c->safe_psql(1, q{DELETE FROM pgjq.queue_fence WHERE shard < 0});
like($c->safe_psql(1, q{SELECT node_port FROM pgjq.route('x')}), qr/^\d+$/, 'L6: served again');

# ------------------------------------- L1: a Citus of another major version

{
	# Citus 13 on PostgreSQL 15, 14 on 18 (src/common/pg_compat.h)
	my $v = $c->safe_psql(2, q{SELECT extversion FROM pg_extension WHERE extname = 'citus'});
	my ($major) = $v =~ /^(\d+)\./;
	my $expect = $c->node(2)->pg_version >= 18 ? 14 : 13;
	is($major, $expect, "L1: the cluster runs Citus $expect");
	$c->safe_psql(2, q{UPDATE pg_catalog.pg_extension SET extversion = '12.1-1' WHERE extname = 'citus'});
	$c->fails_with(2, "SET citus.enable_version_checks = off;\nSELECT * FROM pgjq.route('x')", '0A000',
		qr/pgjq's Citus mode needs Citus $expect, this node has Citus 12\.1-1/, 'L1: Citus 12 is refused');
	$c->safe_psql(2, "UPDATE pg_catalog.pg_extension SET extversion = '$v' WHERE extname = 'citus'");
	like($c->safe_psql(2, q{SELECT node_port FROM pgjq.route('x')}), qr/^\d+$/, "L1: served again with Citus $expect");
}

$c->stop;
done_testing();
