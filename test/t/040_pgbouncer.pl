
# Copyright (c) pgjq contributors
#
# Every pgjq call is one statement with no session state, so it works through
# PgBouncer in transaction pooling mode, where consecutive transactions of one
# client may run on different server connections.  Producers and workers run
# through PgBouncer (psql, then pgbench in simple, extended and prepared
# protocol modes); every committed enqueue is completed exactly once.
#
# Protocol-level prepared statements need PgBouncer 1.21 or later in
# transaction mode (max_prepared_statements); with an older PgBouncer the
# prepared-mode run goes straight to the server instead, and says so.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use POSIX ();
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;

my ($pgbouncer_bin, $bouncer_version) = find_pgbouncer();
plan skip_all => 'pgbouncer is not installed' unless $pgbouncer_bin;
my ($bmajor, $bminor) = split /\./, $bouncer_version;
my $bouncer_prepared = ($bmajor > 1 || ($bmajor == 1 && $bminor >= 21));
note "PgBouncer $bouncer_version";

my $node = PostgreSQL::Test::Cluster->new('bounced');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
});
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgjq;
SELECT pgjq.create_queue('b', lease => '5 seconds');
CREATE TABLE produced (id bigint NOT NULL);
CREATE TABLE claimed (id bigint NOT NULL, token bigint NOT NULL,
                      at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE done (id bigint NOT NULL, token bigint NOT NULL);
-- the final checks look up each completion's claims: some 75,000 jobs on
-- the ring, whose claimed rows a scan each would read 75,000 times over
CREATE INDEX ON claimed (id);
});
my $user = $node->safe_psql('postgres', 'SELECT current_user');

# ------------------------------------------------------------- pgbouncer

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $bouncer = start_pgbouncer($pgbouncer_bin, $node,
	$bouncer_prepared ? (max_prepared_statements => 100) : ());
my ($sockdir, $bport) = ($bouncer->{sockdir}, $bouncer->{port});

# psql through PgBouncer; returns (exit code, stdout, stderr).
sub bounced_psql
{
	my ($sql) = @_;
	my ($stdout, $stderr);
	my $rc = IPC::Run::run [ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1',
		'-h', $sockdir, '-p', $bport, '-d', 'postgres' ],
	  '<', \$sql, '>', \$stdout, '2>', \$stderr;
	chomp $stdout;
	return ($rc ? 0 : 1, $stdout, $stderr);
}

sub bounced_safe_psql
{
	my ($sql) = @_;
	my ($rc, $out, $err) = bounced_psql($sql);
	die "psql through pgbouncer failed: $err\nquery: $sql" if $rc;
	return $out;
}

# ----------------------------------------------------- psql through it

# Each psql call below is a fresh client; pool_mode is transaction, so none
# may rely on session state.
my $id = bounced_safe_psql(
	"SELECT pgjq.enqueue(queue => 'b', payload => '{\"via\": \"pgbouncer\"}', priority => 1::smallint)"
);
like($id, qr/^\d+$/, 'enqueue with named arguments through PgBouncer');
my ($cid, $token, $payload) = split /\|/,
  bounced_safe_psql("SELECT id, token, payload->>'via' FROM pgjq.claim('b', 1, worker => 'psql')");
is($cid, $id, 'claim through PgBouncer');
is($payload, 'pgbouncer', 'the payload comes through');
like(bounced_safe_psql("SELECT pgjq.heartbeat($cid, $token, '10 seconds')"),
	qr/^\d{4}-/, 'heartbeat through PgBouncer');
is(bounced_safe_psql("SELECT pgjq.snooze($cid, $token, '0 seconds')"),
	't', 'snooze through PgBouncer');
ok( $node->poll_query_until('postgres', "SELECT state FROM pgjq.job($id)", 'ready'),
	'the snoozed job is ready again');
($cid, $token) = split /\|/,
  bounced_safe_psql("SELECT id, token FROM pgjq.claim('b')");
is(bounced_safe_psql("SELECT pgjq.fail($cid, $token, 'boom', retry_in => '0 seconds')"),
	'retry', 'fail through PgBouncer');
ok( $node->poll_query_until('postgres', "SELECT state FROM pgjq.job($id)", 'ready'),
	'the failed job is ready again');
($cid, $token) = split /\|/,
  bounced_safe_psql("SELECT id, token FROM pgjq.claim('b')");
is(bounced_safe_psql("SELECT pgjq.complete($cid, $token)"),
	't', 'complete through PgBouncer');
is(bounced_safe_psql("SELECT state || ',' || attempt FROM pgjq.job($id)"),
	'completed,2', 'pgjq.job through PgBouncer: completed on the second attempt');
my @ids = split /\n/,
  bounced_safe_psql("SELECT pgjq.enqueue_many('b', ARRAY['{}', '{}']::jsonb[])");
is(scalar(@ids), 2, 'enqueue_many through PgBouncer');
is( bounced_safe_psql(
		"WITH c AS (SELECT array_agg(id) AS i, array_agg(token) AS t FROM pgjq.claim('b', 10)) SELECT pgjq.complete(i, t) FROM c"
	),
	'2',
	'batch complete through PgBouncer');

# ---------------------------------------------------- pgbench through it

sub write_script
{
	my ($name, $text) = @_;
	my $path = "$tmp/$name.sql";
	open my $sfh, '>', $path or die "could not write $path: $!";
	print $sfh $text;
	close $sfh;
	return $path;
}

my $produce = write_script('produce',
	"INSERT INTO produced SELECT pgjq.enqueue('b', jsonb_build_object('r', random()));\n"
);
my $produce_many = write_script('produce_many',
	"INSERT INTO produced SELECT pgjq.enqueue_many('b', ARRAY['{}', '{}', '{}']::jsonb[]);\n"
);

# Claim (recorded in the same statement), then complete in a second
# transaction, which PgBouncer may run on another server connection.
my $work = write_script(
	'work', q{WITH c AS (SELECT id, token FROM pgjq.claim('b', 1, worker => 'pgbench')),
     l AS (INSERT INTO claimed (id, token) SELECT id, token FROM c RETURNING id, token)
SELECT coalesce(max(id), 0) AS id, coalesce(max(token), 0) AS token FROM l \gset
INSERT INTO done (id, token)
  SELECT :id::bigint, :token::bigint WHERE pgjq.complete(:id::bigint, :token::bigint);
});

sub run_pgbench
{
	my ($mode, $through) = @_;
	my @conn =
	  $through eq 'pgbouncer'
	  ? ('-h', $sockdir, '-p', $bport)
	  : ('-h', $node->host, '-p', $node->port);
	my ($stdout, $stderr);
	my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM done');
	my $rc = IPC::Run::run [
		'pgbench', '-n', @conn, '-M', $mode, '-c', '4', '-j', '2',
		'-T', '5', '-f', "$produce\@4", '-f', "$produce_many\@1",
		'-f', "$work\@6", 'postgres'
	  ],
	  '>', \$stdout, '2>', \$stderr;
	note "pgbench -M $mode through $through:\n$stdout\n$stderr";
	ok($rc, "pgbench -M $mode through $through runs cleanly");
	unlike($stderr, qr/ERROR|aborted/, "pgbench -M $mode through $through: no errors");
	my $after = $node->safe_psql('postgres', 'SELECT count(*) FROM done');
	cmp_ok($after, '>', $before, "pgbench -M $mode through $through completed jobs");
}

run_pgbench('simple', 'pgbouncer');
run_pgbench('extended', 'pgbouncer');
if ($bouncer_prepared)
{
	run_pgbench('prepared', 'pgbouncer');
}
else
{
	note "PgBouncer $bouncer_version cannot pool protocol-level prepared statements in transaction mode (needs 1.21): running -M prepared against the server directly";
	run_pgbench('prepared', 'server');
}

# Drain what is left (jobs claimed as pgbench stopped come back when their
# 5 s lease expires), then check every committed enqueue was completed once.
my $deadline = time + 180;
while (time < $deadline)
{
	my $left = $node->safe_psql('postgres',
		'SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = p.id)'
	);
	last if $left eq '0';
	my $rows = bounced_safe_psql(
		"WITH c AS (SELECT id, token FROM pgjq.claim('b', 500)), l AS (INSERT INTO claimed (id, token) SELECT id, token FROM c RETURNING id, token) SELECT coalesce(string_agg(id || ',' || token, ' '), '') FROM l"
	);
	if ($rows eq '')
	{
		usleep(200_000);
		next;
	}
	my $values = join ', ', map { "($_)" } split / /, $rows;
	bounced_safe_psql(
		"INSERT INTO done (id, token) SELECT i, t FROM (VALUES $values) v(i, t) WHERE pgjq.complete(i, t)"
	);
}

my ($nproduced, $ndone) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT (SELECT count(*) FROM produced), (SELECT count(*) FROM done)');
note "produced $nproduced, completions $ndone";
cmp_ok($nproduced, '>', 0, 'jobs were produced through PgBouncer');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = p.id)'
	),
	'0',
	'every committed enqueue was completed');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM (SELECT id FROM done GROUP BY id HAVING count(*) > 1) x'
	),
	'0',
	'no job was completed twice');
# job(id) of a completed job is a lookup in pgjq.job_done (and the other
# stores before it), about 2 ms: on the ring the 15 s of pgbench complete
# some 70,000 jobs, and a job() per completion took 145 s.  So job() is
# asked for a sample of 2000 completions (a job it does not find counts as
# a failure), and the count of completed jobs per queue_stats, below, covers
# every one of them.
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE j.state IS DISTINCT FROM 'completed')
		   FROM (SELECT id FROM done ORDER BY random() LIMIT 2000) d
		   LEFT JOIN LATERAL pgjq.job(d.id) j ON true"
	),
	'0',
	'every recorded completion of a sample of 2000 is completed per pgjq.job()');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM done d
		   WHERE d.token IS DISTINCT FROM
		         (SELECT c.token FROM claimed c WHERE c.id = d.id ORDER BY c.at DESC LIMIT 1)}
	),
	'0',
	'a completed job was never claimed again');
is( $node->safe_psql(
		'postgres',
		"SELECT ready || ',' || scheduled || ',' || running || ',' || dead || ',' || completed FROM pgjq.queue_stats WHERE queue = 'b'"
	),
	'0,0,0,0,' . ($nproduced + 3),
	'queue_stats: all completed (the produced jobs and the three psql ones)');

$node->stop;
done_testing();
