# PgjqLoad: a producer/worker load with a ledger, for the crash and
# promotion TAP tests (020_crash.pl, 035_promote_load.pl).
#
# Producers and workers are pgbench clients in the background.  Every pgjq
# call records what it did in a ledger table in the same statement, so the
# ledger holds exactly what committed: "produced" (each enqueued id),
# "claimed" (each claim's id, token and lease end), "done" (each successful
# completion).  ledger_checks() then proves nothing was lost, nothing
# completed twice or claimed again after completion, and no job claimed
# while an earlier lease of it was valid.
#
#   my $load = load_setup($node, $tmp);    # queue "c" and the ledger
#   my @bg = load_start($load);            # producers and workers
#   ... crash, promote ...
#   load_drain($load);                     # workers only, until all done
#   ledger_checks($load, $what);
package PgjqLoad;

use strict;
use warnings;

use Exporter 'import';
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT =
  qw(load_setup load_start load_pgbench load_errors load_drain load_count_done bg_wait bg_stop ledger_checks);

sub write_script
{
	my ($tmp, $name, $text) = @_;
	my $path = "$tmp/$name.sql";
	open my $fh, '>', $path or die "could not write $path: $!";
	print $fh $text;
	close $fh;
	return $path;
}

# Creates queue "c" (3 s leases, retries without end) and the ledger tables
# in database postgres of $node, and writes the pgbench scripts into $tmp.
sub load_setup
{
	my ($node, $tmp) = @_;
	$node->safe_psql(
		'postgres', q{
SELECT pgjq.create_queue('c', lease => '3 seconds', max_attempts => 1000,
                         backoff_base => '100 milliseconds', backoff_max => '1 second');
CREATE TABLE produced (id bigint NOT NULL);
CREATE TABLE claimed (id bigint NOT NULL, token bigint NOT NULL,
                      at timestamptz NOT NULL DEFAULT clock_timestamp(),
                      lease_until timestamptz NOT NULL, lease interval NOT NULL);
CREATE TABLE done (id bigint NOT NULL, token bigint NOT NULL,
                   at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON claimed (id);
CREATE INDEX ON done (id);
});
	my %s;
	# producers: the enqueue and the record of its id commit together
	$s{produce_one} = write_script($tmp, 'produce_one',
		"INSERT INTO produced SELECT pgjq.enqueue('c', jsonb_build_object('r', random()));\n"
	);
	$s{produce_many} = write_script($tmp, 'produce_many',
		"INSERT INTO produced SELECT pgjq.enqueue_many('c', ARRAY['{\"n\":1}', '{\"n\":2}', '{\"n\":3}']::jsonb[]);\n"
	);
	# workers: claim (recorded with the claim), then, in a second transaction
	# as a real worker would, complete each job and record the success with it
	$s{work} = write_script(
		$tmp, 'work',
		q{WITH c AS (SELECT id, token, lease_until FROM pgjq.claim('c', 3, lease => '3 seconds')),
     l AS (INSERT INTO claimed (id, token, lease_until, lease)
           SELECT id, token, lease_until, '3 seconds' FROM c RETURNING id, token)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS tokens FROM l \gset
INSERT INTO done (id, token)
  SELECT i, t FROM unnest(':ids'::bigint[], ':tokens'::bigint[]) AS u(i, t)
   WHERE pgjq.complete(i, t);
});
	# a worker that dies silently: its lease must expire and be rescued
	$s{abandon} = write_script($tmp, 'abandon',
		"INSERT INTO claimed (id, token, lease_until, lease) SELECT id, token, lease_until, '2 seconds' FROM pgjq.claim('c', 1, lease => '2 seconds');\n"
	);
	return { node => $node, tmp => $tmp, scripts => \%s, nbg => 0 };
}

# Starts a command in the background, output to files; returns its handle.
sub bg_start
{
	my ($load, $name, @cmd) = @_;
	$load->{nbg}++;
	my $out = "$load->{tmp}/$name.$load->{nbg}.out";
	my $err = "$load->{tmp}/$name.$load->{nbg}.err";
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		$ENV{PGAPPNAME} = $name;    # pg_stat_activity tells the load apart
		open STDOUT, '>', $out or POSIX::_exit(126);
		open STDERR, '>', $err or POSIX::_exit(126);
		exec @cmd or POSIX::_exit(127);
	}
	return { pid => $pid, name => $name, out => $out, err => $err };
}

# Waits up to $secs for a background process to exit; returns its exit
# code, or undef if it is still running.
sub bg_wait
{
	my ($bg, $secs) = @_;
	my $deadline = time + $secs;
	while (time < $deadline)
	{
		my $r = waitpid($bg->{pid}, POSIX::WNOHANG());
		if ($r == $bg->{pid})
		{
			$bg->{status} = $? >> 8;
			return $bg->{status};
		}
		usleep(100_000);
	}
	return undef;
}

sub bg_stop
{
	my ($bg) = @_;
	return $bg->{status} if defined $bg->{status};
	kill 'TERM', $bg->{pid};
	my $rc = bg_wait($bg, 30);
	if (!defined $rc)
	{
		kill 'KILL', $bg->{pid};
		$rc = bg_wait($bg, 30);
	}
	return $rc;
}

# The SQL errors a background pgbench saw (lost connections are not).
sub load_errors
{
	my ($bg) = @_;
	return grep { /ERROR:/ } split /\n/, slurp_file($bg->{err});
}

sub load_pgbench
{
	my ($load, $name, @args) = @_;
	my $node = $load->{node};
	return bg_start($load, $name, 'pgbench', '-n', '-h', $node->host, '-p', $node->port,
		'-T', '900', @args, 'postgres');
}

# Producers (150 enqueue calls/s) and workers (3 clients; one claim in 21
# is abandoned); they exit when their connections die.
sub load_start
{
	my ($load) = @_;
	my $s = $load->{scripts};
	return (
		load_pgbench(
			$load, 'producers', '-c', '2', '-j', '2', '-R', '150',
			'-f', "$s->{produce_one}\@3", '-f', "$s->{produce_many}\@1"),
		load_pgbench(
			$load, 'workers', '-c', '3', '-j', '3', '-f', "$s->{work}\@20",
			'-f', "$s->{abandon}\@1"));
}

sub load_count_done
{
	my ($load) = @_;
	return $load->{node}->safe_psql('postgres', 'SELECT count(*) FROM done');
}

# Workers only, until every committed enqueue is completed (two assertions).
sub load_drain
{
	my ($load) = @_;
	my $node = $load->{node};
	my $drain = load_pgbench($load, 'drain', '-c', '2', '-j', '2', '-f', $load->{scripts}{work});
	ok( $node->poll_query_until(
			'postgres',
			'SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = p.id)',
			'0'),
		'every committed enqueue is completed in the end');
	bg_stop($drain);
	my @errors = load_errors($drain);
	is(scalar(@errors), 0, 'the drain saw no SQL errors') or diag join("\n", @errors);
}

# The ledger against pgjq, after load_drain().
sub ledger_checks
{
	my ($load, $what) = @_;
	my $node = $load->{node};
	my $q = sub { $node->safe_psql('postgres', $_[0]) };
	my ($nproduced, $nclaimed, $ndone) = split /\|/,
	  $q->('SELECT (SELECT count(*) FROM produced), (SELECT count(*) FROM claimed), (SELECT count(*) FROM done)');
	note "$what: produced $nproduced, claims $nclaimed, completions $ndone";

	is($q->('SELECT count(*) - count(DISTINCT id) FROM produced'),
		'0', "$what: enqueue never returned the same id twice");
	is($q->('SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT 1 FROM pgjq.job(p.id))'),
		'0', "$what: no committed enqueue was lost");
	is($q->('SELECT count(*) FROM (SELECT id FROM done GROUP BY id HAVING count(*) > 1) x'),
		'0', "$what: no job was completed twice");
	is( $q->(
			"SELECT count(*) FROM done d, LATERAL pgjq.job(d.id) j WHERE j.state <> 'completed'"),
		'0',
		"$what: every recorded completion is completed per pgjq.job()");
	is( $q->(
			'SELECT count(*) FROM done d WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.id = d.id)'
		),
		'0',
		"$what: nothing was completed that was not committed as an enqueue");
	is( $q->(
			q{SELECT count(*) FROM done d
			   WHERE d.token IS DISTINCT FROM
			         (SELECT c.token FROM claimed c WHERE c.id = d.id ORDER BY c.token DESC LIMIT 1)}
		),
		'0',
		"$what: a completed job was never claimed again (its completion token is its last claim)");
	is( $q->(
			'SELECT count(*) FROM claimed c WHERE NOT EXISTS (SELECT 1 FROM produced p WHERE p.id = c.id)'
		),
		'0',
		"$what: nothing was claimed that was not committed as an enqueue");
	is( $q->(
			q{SELECT count(*) FROM (
			    SELECT lease_until - lease AS start,
			           lag(lease_until) OVER (PARTITION BY id ORDER BY token) AS prev_until
			      FROM claimed) c
			   WHERE start < prev_until}
		),
		'0',
		"$what: no job was claimed again while an earlier lease of it was still valid");
	is( $q->(
			"SELECT ready || ',' || scheduled || ',' || running || ',' || dead || ',' || cancelled || ',' || completed FROM pgjq.queue_stats WHERE queue = 'c'"
		),
		"0,0,0,0,0,$nproduced",
		"$what: queue_stats: every job completed, none left, none extra");
	is($q->("SELECT count(*) FROM pgjq.claim('c', 1000)"), '0', "$what: nothing is left to claim");
	return $nproduced;
}

1;
