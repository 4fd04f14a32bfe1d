
# Copyright (c) pgjq contributors
#
# enqueue(..., after => ids) checks that every named job exists with one
# statement over job(id).  Under READ COMMITTED that statement's snapshot is
# taken first, shared memory read after: a dependency whose completion
# committed in between is gone from shared memory (finished) while its
# job_done row is not in the snapshot, and the enqueue failed with "after
# names job N, which does not exist" (the crash-torture soak: 20 of about
# 2,000 enqueues with dependencies).  The check now looks again, with the
# latest snapshot, and so does job(id) itself when a job's body is in its
# snapshot but the job has left shared memory.  pgjq.debug_pause_at =
# 'ring_job_live' holds the session in that window while the completion
# commits.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('deps_after_window');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q')");
my $x = sql("SELECT pgjq.enqueue('q', '{}')");
my $token = sql("SELECT token FROM pgjq.claim('q')");
ok($token > 0, 'the dependency is running');

# the producer: paused in job(x), after its snapshot, before shared memory
my $offset = -s $node->logfile;
my $p = $node->background_psql('postgres', on_error_stop => 0);
$p->query_safe("SET pgjq.debug_pause_at = 'ring_job_live'");
$p->{stdin} .= "SELECT 'enqueued', count(*) FROM pgjq.enqueue('q', '{}', after => ARRAY[$x]::bigint[]);\n\\echo end of paused\n";
$p->{run}->pump_nb();
$node->wait_for_log(qr/pgjq: pausing at point "ring_job_live"/, $offset);

# the completion commits in the window
is(sql("SELECT pgjq.complete($x, $token)"), 't', 'the dependency completes meanwhile');

pump_until($p->{run}, $p->{timeout}, \$p->{stdout}, qr/end of paused\n/)
  or die "the paused session did not finish";
my ($out, $err) = ($p->{stdout}, $p->{stderr});
$p->quit;
unlike($err, qr/does not exist/, 'the enqueue does not say the dependency does not exist')
  or diag($err);
like($out, qr/enqueued\|1/, 'the dependent is enqueued');

# and it runs: its dependency has completed
sql("SELECT pgjq.promote()");
is(sql("SELECT count(*) FROM pgjq.claim('q')"), '1', 'the dependent is released and claimed');
is(sql("SELECT count(*) FROM pgjq.verify()"), '0', 'verify() finds nothing wrong');

# job(id) itself, in the same window: what the job became, not nothing
# (wait_jobs() reported such a job as unknown: 060_drivers.pl's
# request/response once saw "unknown" for a job that had just completed)
$x = sql("SELECT pgjq.enqueue('q', '{}')");
$token = sql("SELECT token FROM pgjq.claim('q') WHERE id = $x");
ok($token > 0, 'another job is running');
$offset = -s $node->logfile;
$p = $node->background_psql('postgres', on_error_stop => 0);
$p->query_safe("SET pgjq.debug_pause_at = 'ring_job_live'");
$p->{stdin} .= "SELECT 'state', state FROM pgjq.job($x);\n\\echo end of paused\n";
$p->{run}->pump_nb();
$node->wait_for_log(qr/pgjq: pausing at point "ring_job_live"/, $offset);
is(sql("SELECT pgjq.complete($x, $token)"), 't', 'it completes meanwhile');
pump_until($p->{run}, $p->{timeout}, \$p->{stdout}, qr/end of paused\n/)
  or die "the paused session did not finish";
like($p->{stdout}, qr/state\|completed/, 'job(id) in the window says completed')
  or diag($p->{stdout}, $p->{stderr});
$p->quit;

$node->stop;
done_testing();
