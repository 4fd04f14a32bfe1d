
# Copyright (c) pgjq contributors
#
# pgjq keeps each statement's generic plan for the backend's life, so a plan
# is made once, at whatever size pgjq.job has then.  When VACUUM had
# truncated pgjq.job to 0 pages, the due-jobs pick was planned as a
# sequential scan (or a bitmap scan and a sort, which never marks the index
# entries of promoted rows dead) and later walked 200,000 rows per pass:
# FR1's crash phase, p99 lateness 131 ms.  Plans over pgjq.job are now
# planned with sequential and bitmap scans off (spi_plans.h, index_paths).
# Here a session plans promotion on an empty, vacuumed pgjq.job, then 20,000
# jobs fall due: the kept plans must walk job_scheduled_idx.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('plans_empty');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
autovacuum = off
});
$node->start;
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("CREATE EXTENSION pgjq; SELECT pgjq.create_queue('q')");
# a job through pgjq.job and out again, then VACUUM: 0 pages, reltuples 0
sql("SELECT pgjq.enqueue('q', '{}', delay => '10 ms'); SELECT pg_sleep(0.05); SELECT pgjq.promote()");
sql("VACUUM pgjq.job");
is(sql("SELECT relpages || ' ' || reltuples FROM pg_class WHERE oid = 'pgjq.job'::regclass"),
	'0 0', 'pgjq.job is empty and vacuumed');

# one session: plans made now (empty table), kept, used after the table filled
my ($out, $err) = ('', '');
$node->psql(
	'postgres', q{
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SELECT pgjq.promote();
SELECT count(*) FROM pgjq.enqueue_many('q', array_fill('{}'::jsonb, ARRAY[20000]),
                                       run_at => now() + interval '0.3 s');
SELECT pg_sleep(0.5);
SET auto_explain.log_min_duration = 0;
SELECT 'promoted', pgjq.promote();
},
	stdout => \$out,
	stderr => \$err);
like($out, qr/promoted\|20000/, 'the 20,000 due jobs are promoted');

# the plans of the last promote(): after the marker statement's start
my @notices = split /NOTICE:  duration/, $err;
my @pick = grep { /pgjq\.job s WHERE s\.state = 's' AND s\.run_at <= \$1/ && /Plan|Scan/ } @notices;
ok(@pick >= 2, 'the pick was planned and run more than once')
  or diag($err);
my $last = $pick[-1] // '';
like($last, qr/Index Scan using job_scheduled_idx on job s/,
	'the kept pick walks job_scheduled_idx') or diag($last);
unlike($last, qr/Seq Scan on job|Bitmap Heap Scan on job/,
	'no sequential or bitmap scan of pgjq.job') or diag($last);
my @deadline = grep { /SELECT min\(run_at\) FROM pgjq\.job/ } @notices;
unlike($deadline[-1] // '', qr/Seq Scan on job/, 'nor for the next due time')
  if @deadline;

$node->stop;
done_testing();
