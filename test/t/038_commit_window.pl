
# Copyright (c) pgjq contributors
#
# Between a transaction's commit becoming visible to others and pgjq's
# commit callbacks (which make shared memory follow it), other sessions act
# on what the tables say.  pgjq.debug_pause_at = 'commit' holds a session
# in that window for 3 seconds, so these tests act there:
#
# - job(id) of a job a promotion just moved into the ring: its row in
#   pgjq.job is gone, its position not yet in its lane.  job(id) waits for
#   the mover's callback and says ready (it said nothing: review L2).
# - a release_key that committed, and a hold_key of the same key by another
#   transaction in that window that then rolls back: the key ends released
#   (the release's callback took on the other's uncommitted hold, whose
#   rollback then undid nothing: the key stayed held in shared memory while
#   the table said free: review L1).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $node = PostgreSQL::Test::Cluster->new('commit_window');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('w'); SELECT pgjq.create_queue('h')");

# Runs $sql in a new session with the pause set, without waiting for it;
# returns once the session is paused in its commit.
sub paused
{
	my ($sql) = @_;
	my $offset = -s $node->logfile;
	my $s = $node->background_psql('postgres');
	$s->query_safe("SET pgjq.debug_pause_at = 'commit'");
	$s->{stdin} .= "$sql;\n\\echo end of paused\n";
	$s->{run}->pump_nb();
	$node->wait_for_log(qr/pgjq: pausing at point "commit"/, $offset);
	return $s;
}

# Waits for the paused session's statement to end; returns its output.
sub finished
{
	my ($s) = @_;
	pump_until($s->{run}, $s->{timeout}, \$s->{stdout}, qr/end of paused\n/)
	  or die "the paused session did not finish";
	my $out = $s->{stdout};
	$out =~ s/\n?end of paused\n//;
	$s->quit;
	return $out;
}

# L2: job(id) between a promotion's commit and its publication
my $id = sql("SELECT pgjq.enqueue('w', '{}', delay => '0.2 s')");
sleep(1);
my $p = paused('SELECT pgjq.promote()');
is(sql("SELECT state FROM pgjq.job($id)"), 'ready',
	'job(id) of a job promoted, committed, not yet published: ready');
is(finished($p), '1', '... the promotion moved it');
is(sql("SELECT count(*) FROM pgjq.claim('w')"), '1', '... and it is claimable');

# L1: a hold that rolls back in the window of a committed release
my $j = sql("SELECT pgjq.enqueue('h', '{}', fair_key => 'k')");
sql("SELECT pgjq.hold_key('h', 'k', now() + interval '1 hour')");
is(sql("SELECT count(*) FROM pgjq.claim('h')"), '0', 'a held key: its job is not claimed');
my $r = paused("SELECT pgjq.release_key('h', 'k')");
my $b = $node->background_psql('postgres');
$b->query_safe('BEGIN');
$b->query_safe("SELECT pgjq.hold_key('h', 'k', now() + interval '1 hour')");
is(finished($r), 't', 'the release committed (its callback ran after the other hold)');
$b->query_safe('ROLLBACK');
$b->quit;
is(sql("SELECT count(*) FROM pgjq.key_holds"), '0', 'the table holds no key');
is(sql("SELECT count(*) FROM pgjq.claim('h')"), '1',
	'... and shared memory neither: the job is claimed');

# the same the other way round: a committed hold, a release that rolls back
$j = sql("SELECT pgjq.enqueue('h', '{}', fair_key => 'k2')");
my $h = paused("SELECT pgjq.hold_key('h', 'k2', now() + interval '1 hour')");
$b = $node->background_psql('postgres');
$b->query_safe('BEGIN');
$b->query_safe("SELECT pgjq.release_key('h', 'k2')");
finished($h);
$b->query_safe('ROLLBACK');
$b->quit;
is(sql("SELECT count(*) FROM pgjq.key_holds WHERE fair_key = 'k2'"), '1', 'the table holds k2');
is(sql("SELECT count(*) FROM pgjq.claim('h')"), '0', '... and so does shared memory');

verify_ok($node, 'postgres', 'after the windows');
$node->stop;
done_testing();
