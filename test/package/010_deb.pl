#!/usr/bin/perl
#
# test/package/010_deb.pl: the Debian package, as a user meets it.
#
#   1. builds postgresql-15-pgjq from a clean copy of this tree (the work
#      tree's files, committed or not: the tree under test, not git HEAD)
#      with `dpkg-buildpackage -us -uc -b`, and runs lintian on it;
#   2. builds the previous release's package from its tag (v0.4.0, with this
#      tree's debian/ and a 0.4.0-1 changelog: the tag has no debian/), or
#      takes it from /var/cache/pgjq-test/deb/ (keyed by the tag's commit
#      and by debian/'s contents);
#   3. on a new Debian cluster (pg_createcluster 15 pgjqpkg, pgjq preloaded)
#      installs the 0.4.0 package, creates the extension and enqueues jobs,
#      installs this tree's package over it, restarts, ALTER EXTENSION pgjq
#      UPDATE, and checks that the jobs are all there and claimable and that
#      pgjq.verify() finds nothing;
#   4. runs README's "Getting started" statements in a new database, and a
#      delayed job that the background worker promotes;
#   5. removes the package the way README's "Install" says (drop the
#      extension, take pgjq out of shared_preload_libraries, restart, then
#      apt-get remove) and checks that the server still answers and restarts.
#
# Everything is undone at the end, also after a failure (END): the cluster
# is dropped and the package removed.
#
# It changes the system's PostgreSQL 15: installing the package overwrites
# /usr/lib/postgresql/15/lib/pgjq.so and pgjq's files in
# /usr/share/postgresql/15/extension, which `make install` (test/run) put
# there, and removing the package deletes them.  Files that no package owned
# (a `make install`) are saved first and put back at the end.  test/run
# runs this group last for that reason.
#
# By hand, as root, from the top of a checkout (about 70 s cold, 50 s with
# the 0.4.0 package cached):
#
#     prove -v test/package/010_deb.pl
#
# In test/run's scratch copy (no .git) PGJQ_REPO names the repository,
# where the v0.4.0 tag is; without a repository or that tag, the upgrade
# from 0.4.0 is skipped and the rest runs.

use strict;
use warnings;
use Digest::SHA;
use File::Basename qw(dirname basename);
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(time sleep);

use lib dirname(__FILE__);
use PgjqPackage;

my $PG = 15;
my $CLUSTER = 'pgjqpkg';
my $PKG = "postgresql-$PG-pgjq";
my $OLD_TAG = 'v0.4.0';
my $OLD_VERSION = '0.4.0';
my $CACHE = '/var/cache/pgjq-test/deb';
my $SOCKDIR = '/var/run/postgresql';

plan skip_all => 'needs root (it builds, installs and removes a Debian package): sudo prove test/package/010_deb.pl'
  if $> != 0;
plan skip_all => 'needs Debian (no /etc/debian_version or dpkg-query)'
  unless -f '/etc/debian_version' && (run_cmd('dpkg-query', '--version'))[0] == 0;

my $T0 = time();
my $root = tree_root();
my $version = control_version($root);
my $repo = repo_dir();

# ------------------------------------------------------------ preparation

my @missing = apt_ensure(
	'dpkg-dev', 'debhelper', 'build-essential', 'postgresql-server-dev-all',
	"postgresql-$PG", 'postgresql-common', 'lintian', 'git');
is("@missing", '', 'build and test packages installed');

my ($st_rc, $st) = run_cmd('dpkg-query', '-W', '-f=${db:Status-Status}', $PKG);
if ($st_rc == 0 && $st eq 'installed') {
	fail("$PKG is not installed before the test");
	diag("$PKG is installed already; this test installs and removes it: apt-get remove $PKG first");
	done_testing();
	exit 1;
}

# world-readable, so that apt's _apt user can read the .deb files
my $tmp = tempdir('pgjq-deb.XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $tmp;

# A cluster of this name is one this test left behind (killed): drop it.
drop_cluster();

# Files that `make install` put into PostgreSQL 15 (owned by no package).
my $pkglibdir = "/usr/lib/postgresql/$PG/lib";
my $extdir = "/usr/share/postgresql/$PG/extension";
my @installed = grep { -e $_ } (
	"$pkglibdir/pgjq.so", "$pkglibdir/bitcode/pgjq", "$pkglibdir/bitcode/pgjq.index.bc",
	glob("$extdir/pgjq.control $extdir/pgjq--*.sql"));
my $backup;
if (@installed) {
	$backup = "$tmp/make-install.tar";
	run_ok('files of an earlier make install saved', 'tar', '-C', '/', '-cf', $backup,
		map { s{^/}{}r } @installed);
}

my ($port, $installed_pkg, $cluster_made);

END {
	my $rc = $?;
	if ($cluster_made) {
		run_cmd('pg_dropcluster', '--stop', $PG, $CLUSTER);
	}
	my ($r, $s) = run_cmd('dpkg-query', '-W', '-f=${db:Status-Status}', $PKG);
	if ($installed_pkg && $r == 0 && $s eq 'installed') {
		local $ENV{DEBIAN_FRONTEND} = 'noninteractive';
		run_cmd('apt-get', 'remove', '-y', '-q', '-o', 'DPkg::Lock::Timeout=600', $PKG);
	}
	if ($backup && -f $backup) {
		run_cmd('tar', '-C', '/', '-xf', $backup);
	}
	$? = $rc;
}

# ------------------------------------------------------------ the package

# A copy of the work tree without .git and build outputs: what a user who
# unpacked this tree would build.
my $src = "$tmp/new/pgjq-$version";
make_path($src);
my @excludes = map { "--exclude=$_" } (
	'./.git', '*.o', '*.so', '*.bc', '*.deb', '*.zip', './results', './output_iso',
	'./tmp_check*', './log', './log.*', './regression.*', './pgtap', './build-other',
	'./debian/.debhelper', './debian/postgresql-*-pgjq', './debian/files',
	'./debian/*.substvars', './debian/debhelper-build-stamp');
is(system("tar -C '$root' -cf - @excludes . | tar -C '$src' -xf -"), 0, 'tree copied');

my ($vrc, $debver) = run_cmd('dpkg-parsechangelog', '-l', "$src/debian/changelog", '-S', 'Version');
chomp $debver;
is($debver =~ s/-[^-]+$//r, $version, "debian/changelog's version ($debver) is pgjq.control's ($version)");

# The previous release's package first: its build takes this tree's
# debian/ before the new build leaves its outputs there.
my $old_deb;
SKIP: {
	skip("no git repository (set PGJQ_REPO): the upgrade from $OLD_TAG is not tested", 1) unless $repo;
	my ($crc, $commit) = run_cmd('git', '-C', $repo, 'rev-parse', '--verify', '-q', "$OLD_TAG^{commit}");
	chomp $commit;
	skip("$repo has no tag $OLD_TAG: the upgrade from it is not tested", 1) if $crc != 0;
	$old_deb = old_package($commit);
	ok($old_deb && -f $old_deb, "$OLD_VERSION package (" . ($old_deb ? basename($old_deb) : 'none') . ')');
}

my $t = time();
my ($brc, $blog) = run_cmd('sh', '-c', "cd '$src' && dpkg-buildpackage -us -uc -b");
my $deb = "$tmp/new/${PKG}_$debver" . '_amd64.deb';
ok($brc == 0 && -f $deb, "dpkg-buildpackage -us -uc -b yields " . basename($deb))
  or diag(PgjqPackage::tail($blog, 80));
note('build: ' . elapsed($t) . ' s');

my ($lrc, $lout) = run_cmd('lintian', '--fail-on', 'error,warning', '--pedantic', '-I',
	"$tmp/new/pgjq_${debver}_amd64.changes");
$lout =~ s/^running with root privileges is not recommended!\n?//m;
ok($lrc == 0 && $lout !~ /^[EW]:/m, 'lintian: no errors or warnings (--pedantic)') or diag($lout);
note("lintian: $_") for grep { length } split /\n/, $lout;

stop_here('no package was built') unless -f $deb;

# ------------------------------------------------------------ the cluster

$port = free_port();
run_ok("pg_createcluster $PG $CLUSTER --port $port", 'pg_createcluster', $PG, $CLUSTER,
	'--port', $port, '--start-conf', 'manual',
	'-o', 'shared_preload_libraries=pgjq', '-o', 'pgjq.database_names=app,old',
	'-o', 'listen_addresses=', '-o', 'fsync=off');	# sockets only: listen_addresses = ''
$cluster_made = 1;

if ($old_deb) {
	$t = time();
	apt_install_deb($old_deb, "$OLD_VERSION package installed");
	start_cluster();
	psql_is('postgres', 'CREATE DATABASE old', '', 'database old');
	psql_is('old', 'CREATE EXTENSION pgjq', '', "CREATE EXTENSION pgjq ($OLD_VERSION)");
	psql_is('old', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'", $OLD_VERSION,
		"extversion $OLD_VERSION");
	psql('old', "SELECT pgjq.create_queue('legacy')");
	my $ids = psql('old', "SELECT pgjq.enqueue('legacy', jsonb_build_object('n', g)) FROM generate_series(1, 3) g");
	my $later = psql('old', "SELECT pgjq.enqueue('legacy', '{\"n\": 4}', delay => '1 hour')");
	my ($run_id, $run_token) = split /\|/, psql('old', "SELECT id, token FROM pgjq.claim('legacy', lease => '10 min')");
	ok($run_id, "0.4.0: 4 jobs enqueued, job $run_id claimed (token $run_token)");
	psql_is('old', 'SELECT count(*) FROM pgjq.verify()', '0', '0.4.0: pgjq.verify() finds nothing');

	apt_install_deb($deb, "$version package installed over $OLD_VERSION");
	restart_cluster();
	psql_is('old', 'ALTER EXTENSION pgjq UPDATE', '', 'ALTER EXTENSION pgjq UPDATE');
	psql_is('old', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'", $version,
		"extversion $version after the update");
	psql_is('old', "SELECT pgjq.complete($run_id, $run_token)", 't',
		'the job claimed under 0.4.0 completes with its token');
	psql_is('old', "SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM pgjq.claim('legacy', batch => 10)",
		'2,3', 'the other ready jobs are claimable');
	psql_is('old', "SELECT state FROM pgjq.job($later)", 'scheduled', 'the delayed job is still scheduled');
	psql_is('old', 'SELECT count(*) FROM pgjq.verify()', '0', 'after the update: pgjq.verify() finds nothing');
	note("upgrade from $OLD_VERSION: " . elapsed($t) . ' s');
} else {
	apt_install_deb($deb, "$version package installed");
	start_cluster();
}

# ------------------------------------------------------------ getting started

# README's statements, exactly as written there.
my @readme = readme_statements("$root/README.md");
ok(@readme >= 5, scalar(@readme) . " statements in README's \"Getting started\"");
psql_is('postgres', 'CREATE DATABASE app', '', 'database app');
my @out = map { psql('app', $_) } @readme;
is_deeply([ @out[0, 1, 2] ], [ '', '', '1' ], 'README: extension, queue, job 1');
is($out[3], '1|1|{"to": "ada@example.com"}', 'README: claim returns job 1, token 1');
is($out[4], 't', 'README: complete(1, 1) is true');
psql_is('app', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'", $version, "extversion $version");

# A delayed job: the background worker promotes it (job() shows it ready
# before any claim), then a claim gets it.
$t = time();
my $delayed = psql('app', "SELECT pgjq.enqueue('emails', '{\"n\": 2}', delay => '1 s')");
psql_is('app', "SELECT state FROM pgjq.job($delayed)", 'scheduled', 'delayed job is scheduled');
my $state = '';
my $deadline = time() + 30;
while (time() < $deadline) {
	$state = psql('app', "SELECT state FROM pgjq.job($delayed)");
	last if $state eq 'ready';
	sleep 0.1;
}
is($state, 'ready', 'the worker promoted the delayed job (' . elapsed($t) . ' s after enqueue)');
my ($cid, $ctok) = split /\|/, psql('app', "SELECT id, token FROM pgjq.claim('emails')");
is($cid, $delayed, 'a claim gets the promoted job');
psql_is('app', "SELECT pgjq.complete($cid, $ctok)", 't', 'and completes it');
psql_is('app', 'SELECT count(*) FROM pgjq.verify()', '0', 'pgjq.verify() finds nothing');

# ------------------------------------------------------------ removal

# README's order: drop the extension, take pgjq out of
# shared_preload_libraries, restart, then remove the package.
psql_is('app', 'DROP EXTENSION pgjq', '', 'DROP EXTENSION pgjq (app)');
psql_is('old', 'DROP EXTENSION pgjq', '', 'DROP EXTENSION pgjq (old)') if $old_deb;
run_ok('pgjq out of shared_preload_libraries', 'pg_conftool', $PG, $CLUSTER, 'remove',
	'shared_preload_libraries');
run_ok('pgjq.database_names removed', 'pg_conftool', $PG, $CLUSTER, 'remove', 'pgjq.database_names');
restart_cluster();
{
	local $ENV{DEBIAN_FRONTEND} = 'noninteractive';
	run_ok("apt-get remove $PKG", 'apt-get', 'remove', '-y', '-q', '-o', 'DPkg::Lock::Timeout=600', $PKG);
}
ok(!-e "$pkglibdir/pgjq.so", 'pgjq.so is gone');
psql_is('app', 'SELECT 42', '42', 'the server still answers');
restart_cluster();
psql_is('app', "SELECT count(*) FROM pg_available_extensions WHERE name = 'pgjq'", '0',
	'and restarts; pgjq is no longer available');

run_ok("pg_dropcluster $PG $CLUSTER", 'pg_dropcluster', '--stop', $PG, $CLUSTER);
$cluster_made = 0;

note('total: ' . elapsed($T0) . ' s');
done_testing();

# ------------------------------------------------------------ helpers

# old_package(COMMIT): the .deb of $OLD_TAG, from the cache or built now.
sub old_package {
	my ($commit) = @_;
	# debian/'s files other than the changelog (which is replaced) go into
	# the key: a change to the packaging builds the old release again.
	my $sha = Digest::SHA->new(256);
	for my $f (sort grep { -f $_ && !m{/changelog$} } glob("$src/debian/* $src/debian/*/*")) {
		$sha->add(substr($f, length($src)) . "\0");
		$sha->addfile($f);
	}
	my $dir = "$CACHE/$commit-" . substr($sha->hexdigest, 0, 12);
	my $deb = "$dir/${PKG}_$OLD_VERSION-1_amd64.deb";
	if (-f $deb) {
		note("$OLD_TAG package from the cache: $deb");
		return $deb;
	}
	my $t = time();
	my $old = "$tmp/old/pgjq-$OLD_VERSION";
	make_path($old);
	return undef if system("git -C '$repo' archive --format=tar $commit | tar -C '$old' -xf -") != 0;
	return undef if system("cp -a '$src/debian' '$old/'") != 0;
	my ($mrc, $maint) = run_cmd('dpkg-parsechangelog', '-l', "$src/debian/changelog", '-S', 'Maintainer');
	my ($drc, $date) = run_cmd('dpkg-parsechangelog', '-l', "$src/debian/changelog", '-S', 'Date');
	chomp($maint, $date);
	open(my $fh, '>', "$old/debian/changelog") or die $!;
	print $fh "pgjq ($OLD_VERSION-1) unstable; urgency=medium\n\n"
	  . "  * Release $OLD_VERSION ($OLD_TAG) with the packaging of a later tree,\n"
	  . "    built by test/package/010_deb.pl to test the upgrade from it.\n\n"
	  . " -- $maint  $date\n";
	close $fh;
	my ($rc, $log) = run_cmd('sh', '-c', "cd '$old' && dpkg-buildpackage -us -uc -b");
	my $built = "$tmp/old/${PKG}_$OLD_VERSION-1_amd64.deb";
	if ($rc != 0 || !-f $built) {
		diag("building the $OLD_TAG package failed:\n" . PgjqPackage::tail($log, 60));
		return undef;
	}
	make_path($dir);
	system('cp', $built, "$deb.tmp") == 0 && rename("$deb.tmp", $deb) or return $built;
	note("$OLD_TAG package built in " . elapsed($t) . " s, cached in $dir");
	return $deb;
}

sub apt_install_deb {
	my ($file, $name) = @_;
	local $ENV{DEBIAN_FRONTEND} = 'noninteractive';
	$installed_pkg = 1;
	# an older version over a newer one (a rerun after a failure) is a downgrade
	run_ok($name, 'apt-get', 'install', '-y', '-q', '--allow-downgrades', '-o', 'DPkg::Lock::Timeout=600', $file);
}

# A server that does not start ends the test: every later step needs it.
sub start_cluster {
	my ($action) = @_;
	$action //= 'start';
	my ($rc, $out) = run_cmd('pg_ctlcluster', $PG, $CLUSTER, $action);
	ok($rc == 0, "pg_ctlcluster $PG $CLUSTER $action") and return;
	diag($out);
	diag(log_tail());
	stop_here("the server did not $action");
}

sub restart_cluster { start_cluster('restart') }

sub stop_here {
	diag("$_[0]: the remaining steps are not run");
	done_testing();
	exit 1;
}

sub log_tail {
	my $log = "/var/log/postgresql/postgresql-$PG-$CLUSTER.log";
	return -f $log ? PgjqPackage::tail(scalar(`cat '$log'`), 30) : '';
}

sub drop_cluster {
	my ($rc, $out) = run_cmd('pg_lsclusters', '-h');
	if ($out =~ /^$PG\s+$CLUSTER\s/m) {
		note("dropping cluster $PG/$CLUSTER left by an earlier run");
		run_cmd('pg_dropcluster', '--stop', $PG, $CLUSTER);
	}
}

# A port that no cluster, socket or loopback listener uses.
sub free_port {
	my (undef, $clusters) = run_cmd('pg_lsclusters', '-h');
	my %used = map { (split)[2] => 1 } split /\n/, $clusters;
	my $start = 54500 + int(rand(400));
	for my $p ($start .. 54999, 54500 .. $start - 1) {
		next if $used{$p} || -e "$SOCKDIR/.s.PGSQL.$p";
		my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $p, Proto => 'tcp')
		  or next;
		close $s;
		return $p;
	}
	die 'no free port in 54500-54999';
}

# psql(DB, SQL): runs SQL as postgres on the test cluster; the output
# (unaligned, tuples only) without its last newline.  An error fails a test.
sub psql {
	my ($db, $sql) = @_;
	my ($rc, $out) = run_cmd('runuser', '-u', 'postgres', '--', 'psql', '-X', '-qAt',
		'-v', 'ON_ERROR_STOP=1', '-h', $SOCKDIR, '-p', $port, '-d', $db, '-c', $sql);
	if ($rc != 0) {
		fail("psql -d $db -c \"$sql\"");
		diag($out);
		# without a server every later step fails the same way
		stop_here('the server does not answer') if $out =~ /connection to server .* failed/;
	}
	chomp $out;
	return $out;
}

sub psql_is {
	my ($db, $sql, $expected, $name) = @_;
	is(psql($db, $sql), $expected, $name);
}

# The statements of README's "Getting started" section: its first sql block.
sub readme_statements {
	my ($file) = @_;
	open(my $fh, '<', $file) or die "$file: $!";
	my ($in_section, $in_block, @stmts);
	while (<$fh>) {
		if (/^## /) {
			last if $in_section;
			$in_section = /^## Getting started/;
			next;
		}
		next unless $in_section;
		if (/^```sql/) { $in_block = 1; next }
		last if $in_block && /^```/;
		push @stmts, s/\s+$//r if $in_block && /\S/;
	}
	return @stmts;
}
