# test/package/PgjqPackage.pm: helpers shared by test/package/*.pl, the
# tests of pgjq's distribution (the Debian package, the PGXN archive).
#
# Plain Perl and Test::More only: these tests drive Debian's own tools
# (dpkg-buildpackage, apt-get, pg_createcluster, pgxnclient), not
# PostgreSQL::Test::Cluster.
package PgjqPackage;

use strict;
use warnings;
use Cwd qw(abs_path);
use Exporter qw(import);
use File::Basename qw(dirname);
use Test::More;
use Time::HiRes qw(time);

our @EXPORT = qw(run_cmd run_ok apt_ensure tree_root repo_dir control_version elapsed);

# run_cmd(@argv): runs a command without a shell, stdout and stderr
# together; returns (exit status, output).
sub run_cmd {
	my @argv = @_;
	my $pid = open(my $fh, '-|') // die "fork: $!";
	if (!$pid) {
		open(STDERR, '>&', \*STDOUT) or die "dup: $!";
		exec(@argv) or do { print "exec $argv[0]: $!\n"; exit 127 };
	}
	local $/;
	my $out = <$fh> // '';
	close $fh;
	return ($? >> 8, $out);
}

# run_ok(NAME, @argv): one test, passing when the command exits 0; its
# output (last 60 lines) is shown only when it fails.  Returns ok's result.
sub run_ok {
	my ($name, @argv) = @_;
	my ($rc, $out) = run_cmd(@argv);
	return ok($rc == 0, $name) || diag("exit $rc: @argv\n" . tail($out, 60)) && 0;
}

sub tail {
	my ($text, $n) = @_;
	my @l = split /\n/, $text;
	@l = @l[-$n .. -1] if @l > $n;
	return join("\n", @l);
}

# apt_ensure(@packages): installs the Debian packages that are missing
# (root only), from Debian's registry, as test/run does.  Returns the ones
# still missing.
sub apt_ensure {
	my @missing = grep {
		my ($rc, $st) = run_cmd('dpkg-query', '-W', '-f=${db:Status-Status}', $_);
		$rc != 0 || $st ne 'installed'
	} @_;
	return () unless @missing;
	return @missing if $> != 0;
	note("installing: @missing");
	local $ENV{DEBIAN_FRONTEND} = 'noninteractive';
	my @opts = ('-y', '-q', '--no-install-recommends', '-o', 'DPkg::Lock::Timeout=600');
	my ($rc, $out) = run_cmd('apt-get', 'install', @opts, @missing);
	if ($rc != 0) {
		run_cmd('apt-get', 'update', '-q', '-o', 'DPkg::Lock::Timeout=600');
		($rc, $out) = run_cmd('apt-get', 'install', @opts, @missing);
		diag(tail($out, 30)) if $rc != 0;
	}
	return grep {
		my ($r, $st) = run_cmd('dpkg-query', '-W', '-f=${db:Status-Status}', $_);
		$r != 0 || $st ne 'installed'
	} @missing;
}

# The tree these tests belong to (test/run's scratch copy, or a checkout).
sub tree_root {
	return abs_path(dirname(abs_path(__FILE__)) . '/../..');
}

# The git repository of that tree: PGJQ_REPO (test/run sets it, as its
# scratch copy has no .git), else the tree's own.  undef when neither.
sub repo_dir {
	for my $d ($ENV{PGJQ_REPO}, tree_root()) {
		next unless defined $d && length $d && -d $d;
		my ($rc, $top) = run_cmd('git', '-C', $d, 'rev-parse', '--show-toplevel');
		chomp $top;
		return $top if $rc == 0 && -e "$top/.git";
	}
	return undef;
}

# default_version in pgjq.control: the only place the version lives.
sub control_version {
	my ($dir) = @_;
	open(my $fh, '<', "$dir/pgjq.control") or die "$dir/pgjq.control: $!";
	while (<$fh>) {
		return $1 if /^default_version\s*=\s*'([^']+)'/;
	}
	die "no default_version in $dir/pgjq.control";
}

# elapsed(START): seconds since START, one decimal.
sub elapsed {
	return sprintf('%.1f', time() - $_[0]);
}

1;
