# PgjqTest: helpers shared by pgjq's TAP tests (test/t/*.pl).
#
#   use FindBin;
#   use lib "$FindBin::Bin/../perl";
#   use PgjqTest;
package PgjqTest;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(verify_ok crash_at find_pgbouncer start_pgbouncer kill9_restart);

# verify_ok($node, $dbname, $label): pgjq.verify() finds no disagreement
# between shared memory and the tables; on failure the rows are the diagnostic.
sub verify_ok
{
	my ($node, $dbname, $label) = @_;
	my $rows = $node->safe_psql($dbname,
		q{SELECT string_agg(concat_ws(' | ', area, object, expected, found), E'\n') FROM pgjq.verify()}
	);
	return is($rows, '', "verify(): $label");
}

# crash_at($node, $point, $sql, $what): runs $sql in a session with
# pgjq.debug_crash_at = $point (the process kills itself there) and waits
# for the crash restart; the node needs restart_after_crash = on.
sub crash_at
{
	my ($node, $point, $sql, $what) = @_;
	my $offset = -s $node->logfile;
	my ($ret, $out, $err) =
	  $node->psql('postgres', "SET pgjq.debug_crash_at = '$point';\n$sql");
	isnt($ret, 0, "$what: the session died") or diag $out;
	$node->wait_for_log(qr/pgjq: crashing at point "$point"/, $offset);
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
	return ok($node->poll_query_until('postgres', 'SELECT 1', '1'), "$what: the server is back");
}

# find_pgbouncer(): the pgbouncer binary (PATH, else /usr/sbin, where Debian
# puts it outside a user's PATH) or undef, and its version as "major.minor".
sub find_pgbouncer
{
	my $bin = `sh -c 'command -v pgbouncer'`;
	chomp $bin;
	$bin ||= (grep { -x } '/usr/sbin/pgbouncer')[0];
	return (undef, undef) unless $bin;
	my ($version) = `$bin --version` =~ /PgBouncer (\d+\.\d+)/;
	return ($bin, $version);
}

my @bouncer_pids;

END
{
	local $?;    # keep the test's exit status
	for my $pid (@bouncer_pids)
	{
		next unless kill 0, $pid;
		kill 'TERM', $pid;
		waitpid($pid, 0);
	}
}

# start_pgbouncer($bin, $node, %settings): PgBouncer in transaction mode in
# front of $node's database postgres, on a Unix socket only, with pool size
# 2 and the extra [pgbouncer] settings given; waits until it accepts
# connections (one test assertion) and stops it when the test ends.  Returns
# { sockdir, port, log }.
sub start_pgbouncer
{
	my ($bin, $node, %settings) = @_;
	my $tmp = PostgreSQL::Test::Utils::tempdir;
	my $sockdir = PostgreSQL::Test::Utils::tempdir_short;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $user = $node->safe_psql('postgres', 'SELECT current_user');
	my $ini = "$tmp/pgbouncer.ini";
	my %conf = (
		listen_addr => '',
		listen_port => $port,
		unix_socket_dir => $sockdir,
		auth_type => 'any',
		pool_mode => 'transaction',
		default_pool_size => 2,
		max_client_conn => 100,
		server_reset_query => '',
		logfile => "$tmp/pgbouncer.log",
		pidfile => "$tmp/pgbouncer.pid",
		%settings);

	open my $fh, '>', $ini or die "could not write $ini: $!";
	print $fh "[databases]\n";
	print $fh "postgres = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres user=$user\n";
	print $fh "\n[pgbouncer]\n";
	print $fh "$_ = $conf{$_}\n" for sort keys %conf;
	close $fh;

	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>', "$tmp/pgbouncer.out" or POSIX::_exit(126);
		open STDERR, '>&', \*STDOUT or POSIX::_exit(126);
		exec $bin, $ini or POSIX::_exit(127);
	}
	push @bouncer_pids, $pid;

	my $ready = 0;
	for (1 .. 300)
	{
		my ($stdout, $stderr) = ('', '');
		IPC::Run::run [ 'psql', '-XAtq', '-h', $sockdir, '-p', $port, '-d', 'postgres',
			'-c', 'SELECT 1' ], '>', \$stdout, '2>', \$stderr;
		if ($stdout =~ /^1$/m)
		{
			$ready = 1;
			last;
		}
		usleep(100_000);
	}
	ok($ready, 'PgBouncer accepts connections')
	  or diag slurp_file("$tmp/pgbouncer.out") . slurp_file("$tmp/pgbouncer.log");
	return { sockdir => $sockdir, port => $port, log => "$tmp/pgbouncer.log" };
}

# kill9_restart($node, $down_secs): kill -9 of the postmaster; once its
# orphaned children have exited (a new postmaster refuses to start while
# they hold shared memory), wait $down_secs more and start it again.  True
# when it started.
sub kill9_restart
{
	my ($node, $down_secs) = @_;
	open my $fh, '<', $node->data_dir . '/postmaster.pid' or die "no postmaster.pid: $!";
	my $pm = <$fh>;
	chomp $pm;
	close $fh;
	my @children = split ' ', `ps -o pid= --ppid $pm`;
	$node->kill9;
	my $until = time + 120;
	usleep(100_000) while time < $until && grep { kill 0, $_ } @children;
	sleep $down_secs if $down_secs;
	for (1 .. 30)
	{
		return 1 if $node->start(fail_ok => 1);
		sleep 1;
	}
	return 0;
}

1;
