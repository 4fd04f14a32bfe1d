
# Copyright (c) pgjq contributors
#
# The example workers, as they are, in the drivers people use, through
# PgBouncer in transaction mode with a pool smaller than the number of
# workers: examples/worker.py (psycopg 3), worker_async.py (asyncpg),
# worker.js (node-postgres) and worker.sh (psql) serve one queue at once.
# Some jobs fail (and die after their second attempt), some run longer than
# the lease (so only heartbeats keep them).  Checks:
#
# - every job ends exactly once, completed or dead as its payload says, a
#   dead one with the handler's error text; the workers' own reports add up
#   to exactly the completed and dead jobs;
# - each driver handled some jobs, and no worker died or logged an error
#   (a driver preparing statements on the server fails here with "prepared
#   statement ... does not exist / already exists" on PgBouncer < 1.21);
# - completions are not starved behind waiting claims: everything is done
#   within $done_within seconds of the last enqueue (a waiting claim holds a
#   pooled connection; the examples' short default wait bounds the delay);
# - SIGTERM, sent while every worker holds jobs: each worker exits cleanly
#   within 10 s, and no job is left running (the jobs a worker had not
#   started are handed back at once, not left to lease expiry).
#
# The drivers are Debian packages (python3-psycopg, python3-asyncpg, nodejs,
# node-pg); test/run installs them and sets PGJQ_TEST_DRIVERS=required, so
# under `make test` a missing driver fails the test instead of skipping it.
# Debian's node-pg lives in /usr/share/nodejs, which is added to NODE_PATH.

use strict;
use warnings;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use POSIX ();
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my $done_within = 10;    # seconds after the last enqueue, on a loaded machine
my $stop_within = 10;    # seconds after SIGTERM (the contract)
my $lease = 6;           # seconds; the long jobs run 8
my $examples = dirname(__FILE__) . '/../../examples';

# ------------------------------------------------------------ drivers

my @missing;
my $required = ($ENV{PGJQ_TEST_DRIVERS} // '') eq 'required';

sub have
{
	my @cmd = @_;
	return system(join(' ', @cmd) . ' >/dev/null 2>&1') == 0;
}

my ($pgbouncer) = find_pgbouncer();
push @missing, 'pgbouncer' unless $pgbouncer;

# Debian's python3 has the Debian modules; a python3 earlier in PATH (a
# virtualenv, pyenv) may not.
my ($python) =
  grep { have($_, '-c', '"import psycopg, asyncpg"') } ('python3', '/usr/bin/python3');
push @missing, 'python3-psycopg and python3-asyncpg (for python3)' unless $python;

$ENV{NODE_PATH} = join ':', grep { defined && length } $ENV{NODE_PATH}, '/usr/share/nodejs';
my ($node) = grep { have($_, '-e', '"require(\'pg\')"') } ('node', 'nodejs');
push @missing, 'nodejs and node-pg (require("pg") with NODE_PATH=' . $ENV{NODE_PATH} . ')'
  unless $node;

if (@missing)
{
	die "missing drivers under make test: @missing\n" if $required;
	plan skip_all => "not installed: @missing";
}

# ------------------------------------------------------------ server

my $node_pg = PostgreSQL::Test::Cluster->new('drivers');
$node_pg->init;
$node_pg->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
max_connections = 50
});
$node_pg->start;
$node_pg->safe_psql(
	'postgres', qq{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('d', lease => '$lease s', max_attempts => 2,
                         backoff_base => '0.2 s', backoff_max => '0.5 s');
CREATE TABLE produced (id bigint PRIMARY KEY, kind text NOT NULL, error text,
                       at timestamptz NOT NULL DEFAULT clock_timestamp());
});
my $user = $node_pg->safe_psql('postgres', 'SELECT current_user');

# ------------------------------------------------------------ pgbouncer

# Transaction pooling with two server connections for four workers: two
# waiting claims fill the pool and every other call queues behind them.
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $bouncer = start_pgbouncer(
	$pgbouncer, $node_pg,
	reserve_pool_size => 0,
	ignore_startup_parameters => 'extra_float_digits');
my ($sockdir, $bport) = ($bouncer->{sockdir}, $bouncer->{port});

my %pids;    # name -> pid of every process started here

# Starts a program with its output in $tmp/NAME.log; returns its pid.
sub start_process
{
	my ($name, $env, @cmd) = @_;
	# the log exists before the parent looks at it (the child truncates it)
	open my $fh, '>', "$tmp/$name.log" or die "cannot create $tmp/$name.log: $!";
	close $fh;
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>', "$tmp/$name.log" or POSIX::_exit(126);
		open STDERR, '>&', \*STDOUT or POSIX::_exit(126);
		@ENV{ keys %$env } = values %$env;
		exec @cmd or POSIX::_exit(127);
	}
	$pids{$name} = $pid;
	return $pid;
}

END
{
	local $?;    # keep the test's exit status
	for my $pid (values %pids)
	{
		next unless $pid && kill 0, $pid;
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
}

# ------------------------------------------------------------ workers

my %common = (
	PGJQ_BATCH => 3,
	PGJQ_LEASE => $lease,
	# PGJQ_WAIT is left at the examples' default: the advice under test.
);
my %workers = (
	psycopg => [ $python, "$examples/worker.py",
		"host=$sockdir port=$bport dbname=postgres user=$user", 'd' ],
	asyncpg => [ $python, "$examples/worker_async.py",
		"postgresql://$user\@/postgres?host=$sockdir&port=$bport", 'd' ],
	node => [ $node, "$examples/worker.js",
		"postgresql://$user\@localhost:$bport/postgres?host=$sockdir", 'd' ],
	psql => [ 'bash', "$examples/worker.sh", 'd', '-h', $sockdir, '-p', $bport,
		'-d', 'postgres', '-U', $user ],
);
my @names = sort keys %workers;
for my $name (@names)
{
	start_process($name, { %common, PGJQ_WORKER => $name }, @{ $workers{$name} });
}
for my $name (@names)
{
	my $started = 0;
	for (1 .. 600)
	{
		$started = 1, last if slurp_file("$tmp/$name.log") =~ /^worker \S+ started/m;
		usleep(100_000);
	}
	ok($started, "$name worker started") or diag slurp_file("$tmp/$name.log");
}

# ------------------------------------------------------------ jobs

# One enqueue every 0.1 s, each committed at once, straight to the server:
# 80 jobs, every 8th fails ("boom N"), two early ones sleep longer than the
# lease, the others sleep 0 to 0.15 s.
my $n_jobs = 80;
my @long = (2, 6);
my $script = '';
for my $i (1 .. $n_jobs)
{
	my ($kind, $payload, $error) = ('ok', "{\"n\": $i, \"sleep\": " . 0.05 * ($i % 4) . '}', 'NULL');
	if (grep { $_ == $i } @long)
	{
		($kind, $payload) = ('long', "{\"n\": $i, \"sleep\": " . ($lease + 2) . '}');
	}
	elsif ($i % 8 == 0)
	{
		($kind, $payload, $error) = ('fail', "{\"n\": $i, \"fail\": \"boom $i\"}", "'boom $i'");
	}
	$script .=
	  "INSERT INTO produced (id, kind, error) SELECT pgjq.enqueue('d', '$payload'), '$kind', $error;\n"
	  . "SELECT pg_sleep(0.1);\n";
}
$node_pg->safe_psql('postgres', $script);

my %count = map { $_->[0] => $_->[1] } map { [ split /\|/ ] } split /\n/,
  $node_pg->safe_psql('postgres', 'SELECT kind, count(*) FROM produced GROUP BY kind');
is($count{ok} + $count{long} + $count{fail}, $n_jobs, "$n_jobs jobs enqueued");

my $finished_sql = q{SELECT count(*) FROM produced p, pgjq.job(p.id) j
                      WHERE j.state IN ('completed', 'dead')};
ok($node_pg->poll_query_until('postgres', $finished_sql, $n_jobs),
	'every job finished');

is( $node_pg->safe_psql(
		'postgres', q{SELECT count(*) FROM produced p
		               WHERE (SELECT count(*) FROM pgjq.job(p.id)) <> 1}),
	'0',
	'every job has exactly one state');
is( $node_pg->safe_psql(
		'postgres', q{SELECT p.kind || ':' || j.state || ':' || count(*)
		                FROM produced p, pgjq.job(p.id) j
		               GROUP BY p.kind, j.state ORDER BY 1}),
	join("\n", "fail:dead:$count{fail}", "long:completed:$count{long}", "ok:completed:$count{ok}"),
	'failing jobs are dead, the others (the long ones too: heartbeats) completed');
is( $node_pg->safe_psql(
		'postgres', q{SELECT count(*) FROM produced p, pgjq.job(p.id) j
		               WHERE p.kind = 'fail'
		                 AND (j.attempt <> 2 OR j.last_error NOT LIKE '%' || p.error || '%')}),
	'0',
	'dead jobs used both attempts and carry the error text');
my $late = $node_pg->safe_psql(
	'postgres', q{SELECT round(extract(epoch FROM max(j.finished_at) - max(p.at))::numeric, 1)
	                FROM produced p, pgjq.job(p.id) j});
note "last job finished $late s after the last enqueue";
cmp_ok($late, '<=', $done_within,
	"all jobs done within $done_within s of the last enqueue (no starvation behind waiting claims)");
is( $node_pg->safe_psql(
		'postgres', q{SELECT ready || ',' || scheduled || ',' || running FROM pgjq.queue_stats
		               WHERE queue = 'd'}),
	'0,0,0',
	'nothing left in the queue');

# The workers' own reports: "completed N of M" per batch, "job ID OUTCOME: ..."
# per failure.
my (%completed, %dead, %retries, %logs);
for my $name (@names)
{
	$logs{$name} = slurp_file("$tmp/$name.log");
	$completed{$name} += $1 while $logs{$name} =~ /^completed (\d+) of \d+$/mg;
	$dead{$1}++ while $logs{$name} =~ /^job (\d+) dead: /mg;
	$retries{$name}++ while $logs{$name} =~ /^job \d+ retry: /mg;
	note "$name: completed " . ($completed{$name} // 0) . ', retries ' . ($retries{$name} // 0);
	cmp_ok(($completed{$name} // 0) + ($retries{$name} // 0), '>', 0, "$name handled jobs");
}
my $total_completed = 0;
$total_completed += $_ for values %completed;
is($total_completed, $count{ok} + $count{long},
	'the workers reported as many completions as there are completed jobs');
is(scalar(keys %dead), $count{fail}, 'the workers reported each dead job');
is(scalar(grep { $_ != 1 } values %dead), 0, '... once');

for my $name (@names)
{
	is(waitpid($pids{$name}, POSIX::WNOHANG()), 0, "$name worker is alive");
	unlike(
		$logs{$name},
		qr/prepared statement|Traceback|Error:|connection lost|connection error|failed|lost$/m,
		"$name worker logged no error");
}

# ------------------------------------------------------------ request/response

# examples/request_response.sh through PgBouncer: enqueue, then wait_jobs(),
# woken by the commit of whichever worker completes the job.
{
	my @rr = ('bash', "$examples/request_response.sh", 'd', '{"sleep": 0.2}',
		'-h', $sockdir, '-p', $bport, '-d', 'postgres', '-U', $user);
	my $t0 = time;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(\@rr, '>', \$out, '2>', \$err);
	my $took = time - $t0;
	chomp $out;
	ok($ok, 'request_response.sh exits 0 (the job completed)') or diag "$out $err";
	like($out, qr/^\d+\|completed\|1\|$/, "request_response.sh reports the completion ($out)");
	cmp_ok($took, '<', 10, 'it returned on the completion, not at the end of its wait');
	my ($id) = $out =~ /^(\d+)/;
	is( $node_pg->safe_psql('postgres', "SELECT state FROM pgjq.job(" . ($id // 0) . ")"),
		'completed', 'job(id) agrees');
}

# ------------------------------------------------------------ workflow

# examples/workflow.sh through PgBouncer: a graph of 5 jobs (one, then three
# in parallel after it, then one after those) enqueued in one statement, run
# by the workers above as the background worker releases each step, and
# waited for with wait_jobs().
{
	my @wf = ('bash', "$examples/workflow.sh", 'd', '3', '{"sleep": 0.1}',
		'-h', $sockdir, '-p', $bport, '-d', 'postgres', '-U', $user);
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(\@wf, '>', \$out, '2>', \$err);
	chomp $out;
	ok($ok, 'workflow.sh exits 0 (the final step completed)') or diag "$out $err";
	like($out, qr/^\d+\|completed$/, "workflow.sh reports the final step completed ($out)");
	my ($final) = $out =~ /^(\d+)/;
	$final //= 0;
	is( $node_pg->safe_psql(
			'postgres', "SELECT count(*) FROM generate_series($final - 4, $final) i, pgjq.job(i) j
			              WHERE j.state = 'completed'"),
		'5', 'all five steps completed');
}

# ------------------------------------------------------------ debounce

# examples/debounce.sh through PgBouncer: a burst of events for one key makes
# one job (the same id each time) that waits with the last event's payload;
# an event due now makes it ready, and it is claimed once.  A queue no
# worker serves, so the claims here are the only ones.
$node_pg->safe_psql('postgres', q{SELECT pgjq.create_queue('deb')});
{
	my @ids;
	for my $n (1 .. 4)
	{
		my @db = ('bash', "$examples/debounce.sh", 'deb', 'user:42', qq({"event": $n}),
			'-h', $sockdir, '-p', $bport, '-d', 'postgres', '-U', $user);
		my ($out, $err) = ('', '');
		# the first three a minute out; the last one due now
		local $ENV{PGJQ_DEBOUNCE} = $n < 4 ? 60 : 0;
		my $ok = IPC::Run::run(\@db, '>', \$out, '2>', \$err);
		chomp $out;
		ok($ok, "debounce.sh event $n") or diag $err;
		push @ids, $out;
		is( $node_pg->safe_psql(
				'postgres', "SELECT state || ' ' || (payload->>'event') FROM pgjq.job($ids[0])"),
			'scheduled 3', 'the burst waits as one job, with the last event\'s payload')
		  if $n == 3;
	}
	my %distinct = map { $_ => 1 } @ids;
	is(scalar(keys %distinct), 1, 'debounce.sh: one job for the events (' . join(',', @ids) . ')');
	is( $node_pg->safe_psql(
			'postgres', q{SELECT string_agg(id || ':' || (payload->>'event') || ':' || attempt, ',')
			                FROM pgjq.claim('deb', 10)}),
		"$ids[0]:4:1", 'the event due now made it ready: claimed once, with its payload');
	is($node_pg->safe_psql('postgres', q{SELECT count(*) FROM pgjq.claim('deb', 10)}),
		'0', 'nothing else to claim');
}

# ------------------------------------------------------------ SIGTERM

# 16 jobs of 2 s: with batches of 3 every worker holds some, runs one and
# has others waiting when it is told to stop.
$node_pg->safe_psql(
	'postgres', q{CREATE TABLE term_jobs AS
	               SELECT pgjq.enqueue('d', '{"sleep": 2}') AS id FROM generate_series(1, 16)});
ok( $node_pg->poll_query_until(
		'postgres', q{SELECT count(DISTINCT j.worker) FROM term_jobs t, pgjq.job(t.id) j
		               WHERE j.state = 'running'}, scalar(@names)),
	'every worker holds jobs');

my $sent = time;
kill 'TERM', $pids{$_} for @names;
my %exited;
while (keys %exited < @names && time - $sent < 60)
{
	for my $name (@names)
	{
		next if exists $exited{$name};
		if (waitpid($pids{$name}, POSIX::WNOHANG()) == $pids{$name})
		{
			$exited{$name} = [ time - $sent, $? ];
			delete $pids{$name};
		}
	}
	usleep(50_000);
}
for my $name (@names)
{
	my ($after, $status) = @{ $exited{$name} // [ 'never', -1 ] };
	note "$name exited after $after s, status $status";
	ok(defined $exited{$name} && $after <= $stop_within,
		"$name worker exits within $stop_within s of SIGTERM");
	is($status, 0, "$name worker exits cleanly");
	like(slurp_file("$tmp/$name.log"), qr/^worker \S+ stopped$/m, "$name worker says it stopped");
}
is( $node_pg->safe_psql(
		'postgres', q{SELECT count(*) FROM term_jobs t, pgjq.job(t.id) j
		               WHERE j.state = 'running' OR j.last_error IS NOT NULL}),
	'0',
	'no job left running, none left to lease expiry');
is( $node_pg->safe_psql(
		'postgres', q{SELECT count(*) FROM term_jobs t, pgjq.job(t.id) j
		               WHERE j.state NOT IN ('completed', 'ready')}),
	'0',
	'jobs were completed or handed back ready');

$node_pg->stop;
done_testing();
