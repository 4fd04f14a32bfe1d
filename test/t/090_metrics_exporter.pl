# Copyright (c) pgjq contributors
#
# Metrics end to end, as monitoring sees them:
#
# 1. A known workload on a preloaded server: 100 jobs enqueued, 60 claimed
#    in one batch and completed, 5 claimed and failed with their attempts
#    spent (dead), 35 left ready.
# 2. The real prometheus-postgres-exporter (Debian's, 0.11) runs on a free
#    loopback port with contrib/prometheus/pgjq-queries.yaml, connected as a
#    login role that is only a member of pg_monitor; its HTTP endpoint shows
#    pgjq's series with those values, and promtool accepts its output.
# 3. promtool check metrics accepts pgjq.metrics_prometheus().
# 4. Without shared_preload_libraries (on an extension created with it, as
#    CREATE EXTENSION needs it) the gauges still work, the counters are
#    absent and pgjq_counters_available is 0, in metrics() and through the
#    exporter.
# 5. With pgjq.max_metrics_queues smaller than the queues, counts overflow
#    into pgjq_metrics_overflow_total and no queue shows a false zero.

use strict;
use warnings;

use FindBin;
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $exporter_bin = '/usr/bin/prometheus-postgres-exporter';
my $promtool = `sh -c 'command -v promtool'`;
chomp $promtool;
my $required = ($ENV{PGJQ_TEST_DRIVERS} // '') eq 'required';
if (!-x $exporter_bin || !$promtool)
{
	plan skip_all => 'prometheus-postgres-exporter or promtool is not installed'
	  unless $required;
	BAIL_OUT('prometheus-postgres-exporter and prometheus (promtool) must be installed');
}
my $queries = "$FindBin::Bin/../../contrib/prometheus/pgjq-queries.yaml";
ok(-r $queries, 'the queries file is in contrib/prometheus');

my $node = PostgreSQL::Test::Cluster->new('metrics');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
});
$node->start;

# ---------------------------------------------------------- the workload

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
CREATE ROLE exporter LOGIN IN ROLE pg_monitor;
SELECT pgjq.create_queue('ship', max_attempts => 1);
SELECT pgjq.create_queue('idle');
SELECT count(pgjq.enqueue('ship', jsonb_build_object('n', i))) FROM generate_series(1, 100) i;
SELECT pgjq.complete(array_agg(id), array_agg(token)) FROM pgjq.claim('ship', 60);
SELECT count(pgjq.fail(id, token, 'no')) FROM pgjq.claim('ship', 5);
SELECT pgjq.hold_key('ship', 'tenant-a', now() + interval '1 hour');
});

# the rows of metrics() as the exporter's role
my $rows = $node->safe_psql(
	'postgres', q{
SELECT name || coalesce(labels->>'state', '') || '=' || value FROM pgjq.metrics('ship')
 WHERE name IN ('pgjq_jobs_enqueued_total', 'pgjq_jobs_claimed_total', 'pgjq_jobs_completed_total',
                'pgjq_jobs_dead_total', 'pgjq_jobs', 'pgjq_job_run_seconds_count')
 ORDER BY name COLLATE "C", labels->>'state'},
	extra_params => [ '-U', 'exporter' ]);
is( $rows,
	join("\n",
		'pgjq_job_run_seconds_count=65', 'pgjq_jobsdead=5',
		'pgjq_jobsready=35', 'pgjq_jobsrunning=0',
		'pgjq_jobsscheduled=0', 'pgjq_jobswaiting=0', 'pgjq_jobs_claimed_total=65',
		'pgjq_jobs_completed_total=60', 'pgjq_jobs_dead_total=5',
		'pgjq_jobs_enqueued_total=100'),
	'metrics() after the workload, read by a pg_monitor member');

# Exact under concurrency: 4 clients run complete_and_claim cycles until a
# queue of 2,000 jobs is drained while another session reads the metrics.
$node->safe_psql(
	'postgres', q{
SELECT pgjq.create_queue('busy');
SELECT count(*) FROM pgjq.enqueue_many('busy', array_fill('{}'::jsonb, ARRAY[2000]));
});
my $cycle = $PostgreSQL::Test::Utils::tmp_check . '/cycle.sql';
PostgreSQL::Test::Utils::append_to_file(
	$cycle, q{SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks
  FROM pgjq.complete_and_claim('busy', :ids::bigint[], :toks::bigint[], 10) \gset
\if :n = 0
  \shell false
\endif
});
my $pgbench = IPC::Run::start(
	[
		'pgbench', '-n', '-M', 'prepared', '-c', '4', '-j', '2', '-t', '100000', '-f', $cycle,
		'-D', 'ids={}', '-D', 'toks={}', '-h', $node->host, '-p', $node->port, 'postgres'
	],
	'>', \my $pgbench_out, '2>', \my $pgbench_err);
my $reads = 0;
while ($pgbench->pumpable)
{
	$node->safe_psql('postgres', 'SELECT count(*) FROM pgjq.metrics()');
	$node->safe_psql('postgres', "SELECT length(pgjq.metrics_prometheus('busy'))");
	$reads++;
	$pgbench->pump_nb;
	usleep(20_000);
}
$pgbench->finish;
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(name || '=' || value, ',' ORDER BY name COLLATE "C") FROM pgjq.metrics('busy')
 WHERE name IN ('pgjq_jobs_enqueued_total', 'pgjq_jobs_claimed_total', 'pgjq_jobs_completed_total',
                'pgjq_stale_outcomes_total', 'pgjq_job_run_seconds_count', 'pgjq_job_run_unknown_total')}),
	'pgjq_job_run_seconds_count=2000,pgjq_job_run_unknown_total=0,pgjq_jobs_claimed_total=2000,'
	  . 'pgjq_jobs_completed_total=2000,pgjq_jobs_enqueued_total=2000,pgjq_stale_outcomes_total=0',
	"4 concurrent workers: every claim and completion counted once ($reads reads meanwhile)");
$node->safe_psql('postgres', "SELECT pgjq.drop_queue('busy')");

# ------------------------------------------------------ the real exporter

# start_exporter($node, $name): the exporter on a free loopback port with
# the queries file, connected to $node as the role exporter; returns its URL.
my @exporters;
END { local $?; $_->kill_kill for @exporters; }

sub start_exporter
{
	my ($n, $name) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = $PostgreSQL::Test::Utils::tmp_check . "/exporter_$name.log";
	my $dsn = sprintf('host=%s port=%d user=exporter dbname=postgres sslmode=disable',
		$n->host, $n->port);
	push @exporters, IPC::Run::start(
		[
			$exporter_bin, "--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$queries", '--disable-default-metrics',
			'--disable-settings-metrics', '--log.level=info'
		],
		'<', \undef, '>', $log, '2>&1',
		init => sub { $ENV{DATA_SOURCE_NAME} = $dsn });
	return ("http://127.0.0.1:$port/metrics", $log);
}

# scrape($url, $re): the page, once it matches $re (the exporter connects
# lazily) or the harness's timeout has passed
my $http = HTTP::Tiny->new(timeout => 10);

sub scrape
{
	my ($url, $re) = @_;
	my $page = '';
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my $res = $http->get($url);
		$page = $res->{content} // '';
		last if $res->{success} && $page =~ $re;
		usleep(200_000);
	}
	return $page;
}

my ($url, $exporter_log) = start_exporter($node, 'metrics');
my $body = scrape($url, qr/^pgjq_jobs_enqueued_total\{/m);
like($body, qr/^pgjq_jobs_enqueued_total\{/m, 'the exporter serves pgjq series')
  or diag(slurp_file($exporter_log));

# sample value by name and labels (a subset, in any order)
sub sample
{
	my ($text, $name, %want) = @_;
	for my $line (split /\n/, $text)
	{
		next unless $line =~ /^\Q$name\E\{([^}]*)\} (\S+)$/;
		my ($labels, $value) = ($1, $2);
		my %l = $labels =~ /(\w+)="((?:[^"\\]|\\.)*)"/g;
		next if grep { !defined $l{$_} || $l{$_} ne $want{$_} } keys %want;
		return $value;
	}
	return undef;
}

my %expect = (
	pgjq_jobs_enqueued_total => 100,
	pgjq_jobs_claimed_total => 65,
	pgjq_jobs_completed_total => 60,
	pgjq_jobs_dead_total => 5,
	pgjq_jobs_failed_total => 0,
	pgjq_jobs_ready => 35,
	pgjq_jobs_running => 0,
	pgjq_jobs_dead => 5,
	pgjq_jobs_held_keys => 1,
	pgjq_stale_outcomes_total => 0,
	pgjq_job_run_seconds_count => 65,
	pgjq_claim_wait_seconds_count => 0,);
for my $name (sort keys %expect)
{
	is(sample($body, $name, queue => 'ship'), $expect{$name}, "exporter: $name of ship");
}
is(sample($body, 'pgjq_job_run_seconds_bucket', queue => 'ship', le => '+Inf'),
	65, 'exporter: the run-time histogram ends in +Inf with every outcome');
is(sample($body, 'pgjq_jobs_enqueued_total', queue => 'idle'),
	0, 'exporter: a queue with nothing done shows zeros');
is(sample($body, 'pgjq_database_counters_available', database => 'postgres'),
	1, 'exporter: counters available');
is(sample($body, 'pgjq_database_metrics_overflow_total', database => 'postgres'),
	0, 'exporter: no overflow');
like(sample($body, 'pgjq_database_horizon_age_xacts', database => 'postgres') // '',
	qr/^\d+$/, 'exporter: horizon age in transactions');

# the worker's pass, once it has made one
$body = scrape($url, qr/^pgjq_database_worker_last_pass_timestamp_seconds\{[^}]*\} \d/m);
my $pass = sample($body, 'pgjq_database_worker_last_pass_timestamp_seconds',
	database => 'postgres');
ok(defined $pass && $pass =~ /^[0-9.e+]+$/ && abs($pass - time) < 60,
	'exporter: the worker\'s last pass is recent');

# promtool accepts what the exporter serves
my $scrape_file = $PostgreSQL::Test::Utils::tmp_check . '/scrape.txt';
PostgreSQL::Test::Utils::append_to_file($scrape_file, $body);
my ($out, $err) = ('', '');
my $ok = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', $scrape_file, '>', \$out, '2>', \$err);
ok($ok, 'promtool check metrics accepts the exporter\'s page') or diag("$out$err");

# ------------------------------------------- promtool on metrics_prometheus()

my $text = $node->safe_psql('postgres', 'SELECT pgjq.metrics_prometheus()',
	extra_params => [ '-U', 'exporter' ]);
like($text, qr/^pgjq_jobs_completed_total\{queue="ship"\} 60$/m,
	'metrics_prometheus(): completed');
like($text, qr/^# TYPE pgjq_job_run_seconds histogram$/m, 'metrics_prometheus(): a histogram');
($out, $err) = ('', '');
$ok = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \"$text\n", '>', \$out, '2>', \$err);
ok($ok, 'promtool check metrics accepts metrics_prometheus()') or diag("$out$err\n$text");

# ---------------------------------------------------- without preload

# CREATE EXTENSION needs the preload (the ring engine, every queue's
# default, keeps its jobs in shared memory), as does an enqueue into a ring
# queue: the extension, the queue and its jobs are made with the preload,
# then the server is restarted without it.
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->append_conf('postgresql.conf', "shared_preload_libraries = 'pgjq'\npgjq.database_names = ''");
$plain->start;
$plain->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('q');
SELECT count(pgjq.enqueue('q')) FROM generate_series(1, 3);
});
$plain->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$plain->restart;
is( $plain->safe_psql(
		'postgres', q{
SELECT string_agg(name || coalesce(labels->>'state', '') || '=' || value, ',' ORDER BY name, labels->>'state')
  FROM pgjq.metrics()
 WHERE name NOT IN ('pgjq_oldest_ready_age_seconds', 'pgjq_horizon_age_seconds', 'pgjq_horizon_age_xacts')}),
	'pgjq_counters_available=0,pgjq_held_keys=0,pgjq_jobsdead=0,pgjq_jobsready=3,pgjq_jobsrunning=0,pgjq_jobsscheduled=0,pgjq_jobswaiting=0',
	'without preload: gauges, no counters, counters_available 0');
is( $plain->safe_psql(
		'postgres', q{
SELECT string_agg(DISTINCT name, ',') FROM pgjq.metrics()
 WHERE name IN ('pgjq_oldest_ready_age_seconds', 'pgjq_horizon_age_xacts')}),
	'pgjq_horizon_age_xacts,pgjq_oldest_ready_age_seconds',
	'without preload: the age gauges too');
$text = $plain->safe_psql('postgres', 'SELECT pgjq.metrics_prometheus()');
unlike($text, qr/_total/, 'without preload: no counter in the text');

# and through the exporter: gauges, no counters nor histograms
$plain->safe_psql('postgres', 'CREATE ROLE exporter LOGIN IN ROLE pg_monitor');
my ($plain_url, $plain_log) = start_exporter($plain, 'plain');
my $plain_body = scrape($plain_url, qr/^pgjq_jobs_ready\{/m);
is(sample($plain_body, 'pgjq_jobs_ready', queue => 'q'), 3, 'exporter without preload: gauges')
  or diag(slurp_file($plain_log));
is(sample($plain_body, 'pgjq_database_counters_available', database => 'postgres'),
	0, 'exporter without preload: counters_available 0');
unlike($plain_body, qr/^pgjq_(jobs_\w+_total|job_run_seconds\w*|claim_wait_seconds\w*)\{/m,
	'exporter without preload: no counter and no histogram');
($out, $err) = ('', '');
$ok = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \"$text\n", '>', \$out, '2>', \$err);
ok($ok, 'promtool accepts the text without preload') or diag("$out$err");

# ------------------------------------------- more queues than entries

# pgjq.max_metrics_queues = 16: the 17th queue and later ones find no
# entry; their counts go to the overflow counter, their counters are left
# out (not shown as zeros), and nothing fails.
my $small = PostgreSQL::Test::Cluster->new('small');
$small->init;
$small->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pgjq'
pgjq.database_names = ''
pgjq.max_metrics_queues = 16
});
$small->start;
$small->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT count(pgjq.create_queue(format('q%s', lpad(i::text, 2, '0')))) FROM generate_series(1, 20) i;
SELECT count(pgjq.enqueue(format('q%s', lpad(i::text, 2, '0')))) FROM generate_series(1, 20) i;
});
is( $small->safe_psql(
		'postgres', q{
SELECT (SELECT value FROM pgjq.metrics() WHERE name = 'pgjq_metrics_overflow_total') > 0,
       (SELECT count(*) FROM pgjq.metrics() WHERE name = 'pgjq_jobs_enqueued_total'),
       (SELECT sum(value) FROM pgjq.metrics() WHERE name = 'pgjq_jobs_enqueued_total')
         + (SELECT value FROM pgjq.metrics() WHERE name = 'pgjq_metrics_overflow_total'),
       (SELECT count(DISTINCT labels->>'queue') FROM pgjq.metrics() WHERE name = 'pgjq_jobs')}),
	't|16|20|20',
	'a full counter table: counts overflow, no queue shows a false zero, gauges for all');
$text = $small->safe_psql('postgres', 'SELECT pgjq.metrics_prometheus()');
($out, $err) = ('', '');
$ok = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \"$text\n", '>', \$out, '2>', \$err);
ok($ok, 'promtool accepts the text with overflow') or diag("$out$err");
$small->stop;

$plain->stop;
$node->stop;
done_testing();
