#!/usr/bin/perl
#
# test/package/020_pgxn.pl: the PGXN archive, as PGXN and its client see it.
#
#   1. clones the repository into a temporary directory, checks out the
#      repository's HEAD and runs `make dist` there: the archive is made by
#      git from HEAD, so uncommitted changes in a work tree are not in it
#      (and are not tested here);
#   2. checks META.json, the archive's copy, against PGXN's Meta Spec 1.0.0
#      (test/package/pgxn-meta-schema.json, with Debian's python3-jsonschema:
#      Debian has no PGXN validator, and pgxnclient only parses META.json),
#      and that its version, pgjq.control's and the archive's top folder agree;
#   3. installs the archive with `pgxn install` (Debian's pgxnclient), which
#      builds it with make, into a relocated copy of Debian's PostgreSQL 15
#      (/usr/lib/postgresql/15, /usr/share/postgresql/15 and
#      /usr/include/postgresql copied under a temporary usr/: pg_config
#      reports the copy's paths), never into the system's;
#   4. starts a throwaway preloaded server of that copy (as postgres when
#      root), CREATE EXTENSION pgjq, and enqueues, claims and completes.
#
# By hand (root installs pgxnclient and python3-jsonschema if missing;
# another user needs them installed), from the top of a checkout (about 30 s):
#
#     prove -v test/package/020_pgxn.pl
#
# In test/run's scratch copy (no .git) PGJQ_REPO names the repository.

use strict;
use warnings;
use File::Basename qw(dirname basename);
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use Test::More;
use Time::HiRes qw(time);

use lib dirname(__FILE__);
use PgjqPackage;

my $PG = 15;
my $PYTHON = '/usr/bin/python3';	# Debian's, where python3-jsonschema is

plan skip_all => 'needs Debian (no /etc/debian_version or dpkg-query)'
  unless -f '/etc/debian_version' && (run_cmd('dpkg-query', '--version'))[0] == 0;
my $repo = repo_dir();
plan skip_all => 'no git repository: set PGJQ_REPO to a checkout (make dist archives git HEAD)'
  unless $repo;
my @missing = apt_ensure('pgxnclient', 'python3-jsonschema', 'git', 'make', 'build-essential',
	"postgresql-$PG", "postgresql-server-dev-$PG");
plan skip_all => "missing Debian packages: apt-get install @missing" if @missing;

my $T0 = time();
my $here = dirname(__FILE__);
my $schema = "$here/pgxn-meta-schema.json";
my $tmp = tempdir('pgjq-pgxn.XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $tmp;
my $user = $> == 0 ? 'postgres' : undef;
my ($pgdata, $pgbin);

END {
	my $rc = $?;
	as_user("$pgbin/pg_ctl", '-D', $pgdata, '-m', 'immediate', 'stop')
	  if $pgdata && -f "$pgdata/postmaster.pid";
	$? = $rc;
}

# ------------------------------------------------------------ make dist

my ($hrc, $head) = run_cmd('git', '-C', $repo, 'rev-parse', 'HEAD');
chomp $head;
my $clone = "$tmp/clone";
run_ok('git clone of the repository', 'git', 'clone', '-q', '--no-checkout', $repo, $clone);
run_ok("checkout of HEAD ($head)", 'git', '-C', $clone, 'checkout', '-q', $head);
my $version = control_version($clone);
my $zip = "$clone/pgjq-$version.zip";
run_ok('make dist', 'make', '-C', $clone, "PG_CONFIG=/usr/lib/postgresql/$PG/bin/pg_config", 'dist');
ok(-f $zip, "make dist made pgjq-$version.zip") or stop_here('no archive');

# ------------------------------------------------------------ META.json

my $check_py = <<'PY';
import json, sys, zipfile
import jsonschema
schema_file, zip_file, version = sys.argv[1:4]
with open(schema_file) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
with zipfile.ZipFile(zip_file) as z:
    names = z.namelist()
    tops = sorted({n.split('/', 1)[0] for n in names})
    print('top folders:', ' '.join(tops))
    meta = json.loads(z.read(tops[0] + '/META.json'))
errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(meta), key=str)
for e in errors:
    print('META.json invalid at', '/'.join(map(str, e.path)) or '(top)', ':', e.message)
print('version:', meta['version'])
print('provides:', ' '.join('%s=%s' % (k, v['version']) for k, v in sorted(meta['provides'].items())))
sys.exit(1 if errors else 0)
PY
my ($mrc, $mout) = run_cmd($PYTHON, '-c', $check_py, $schema, $zip, $version);
ok($mrc == 0, "the archive's META.json is valid against PGXN's Meta Spec 1.0.0") or diag($mout);
like($mout, qr/^top folders: pgjq-\Q$version\E$/m, "one top folder, pgjq-$version/") or diag($mout);
like($mout, qr/^version: \Q$version\E$/m, "META.json's version is pgjq.control's ($version)");
like($mout, qr/^provides: pgjq=\Q$version\E$/m, "META.json provides pgjq $version");

# The schema is not a rubber stamp: a META.json without a license, with a
# two-part version and a name with a space is refused.
my ($brc, $bout) = run_cmd($PYTHON, '-c', <<'PY', $schema, "$clone/META.json");
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
meta = json.load(open(sys.argv[2]))
del meta['license']
meta['version'] = '1.0'
meta['name'] = 'pg jq'
errors = list(jsonschema.Draft202012Validator(schema).iter_errors(meta))
print(len(errors))
PY
chomp $bout;
is($bout, '3', 'the schema refuses a broken META.json (3 errors)');

# ------------------------------------------------------------ pgxn install

# A relocated PostgreSQL 15, as /opt/pg-h1 is made.
my $pgroot = "$tmp/pg";
# (pgxn checks that pg_config --libdir, usr/lib/x86_64-linux-gnu, is writable:
# an empty one is made for it)
make_path("$pgroot/usr/lib/postgresql", "$pgroot/usr/share/postgresql", "$pgroot/usr/include",
	"$pgroot/usr/lib/x86_64-linux-gnu");
run_ok('PostgreSQL 15 copied', 'sh', '-c',
	"cp -a /usr/lib/postgresql/$PG $pgroot/usr/lib/postgresql/ && "
	  . "cp -a /usr/share/postgresql/$PG $pgroot/usr/share/postgresql/ && "
	  . "cp -a /usr/include/postgresql $pgroot/usr/include/ && "
	  . "rm -rf $pgroot/usr/lib/postgresql/$PG/lib/pgjq.so $pgroot/usr/lib/postgresql/$PG/lib/bitcode/pgjq* "
	  . "$pgroot/usr/share/postgresql/$PG/extension/pgjq[.-]*");
$pgbin = "$pgroot/usr/lib/postgresql/$PG/bin";
my $pg_config = "$pgbin/pg_config";
my ($prc, $pkglibdir) = run_cmd($pg_config, '--pkglibdir');
chomp $pkglibdir;
is($pkglibdir, "$pgroot/usr/lib/postgresql/$PG/lib", "the copy's pg_config reports its own paths");

my $t = time();
my $unpacked = "$tmp/unpacked";
run_ok('archive unpacked', $PYTHON, '-m', 'zipfile', '-e', $zip, $unpacked);
ok(-f "$unpacked/pgjq-$version/Makefile" && -f "$unpacked/pgjq-$version/pgjq.control",
	'the unpacked archive has the Makefile and pgjq.control');
# pgxn install from the archive file itself: it unpacks, builds and installs
run_ok("pgxn install ./pgjq-$version.zip --pg_config <copy>", 'sh', '-c',
	"cd '$clone' && pgxn install --pg_config '$pg_config' ./pgjq-$version.zip");
note('pgxn install: ' . elapsed($t) . ' s');
ok(-f "$pkglibdir/pgjq.so", 'pgjq.so installed into the copy');
ok(-f "$pgroot/usr/share/postgresql/$PG/extension/pgjq--$version.sql", "pgjq--$version.sql installed into the copy");

# ------------------------------------------------------------ a server

# the server's user owns the directory of its data and socket
my $run = "$tmp/run";
my $sock = "$run/sock";
$pgdata = "$run/data";
make_path($sock);
system('chown', '-R', "$user:", $run) if $user;
run_ok('initdb', as_user_argv("$pgbin/initdb", '-D', $pgdata, '-A', 'trust', '-E', 'UTF8',
	'--locale=C', '--no-sync'));
open(my $conf, '>>', "$pgdata/postgresql.conf") or die $!;
print $conf "shared_preload_libraries = 'pgjq'\nlisten_addresses = ''\n"
  . "unix_socket_directories = '$sock'\nport = 5432\nfsync = off\n";
close $conf;
run_ok('server of the copy started', as_user_argv("$pgbin/pg_ctl", '-D', $pgdata, '-l',
	"$sock/server.log", '-w', '-t', '60', 'start'))
  or do { diag(scalar `tail -n 30 '$sock/server.log'`); stop_here('no server') };

my $sql = <<"SQL";
CREATE EXTENSION pgjq;
SELECT extversion FROM pg_extension WHERE extname = 'pgjq';
SELECT pgjq.create_queue('pgxn');
SELECT pgjq.enqueue('pgxn', '{"from": "pgxn"}');
CREATE TEMP TABLE c AS SELECT id, token FROM pgjq.claim('pgxn');
SELECT count(*) FROM c;
SELECT pgjq.complete(id, token) FROM c;
SELECT count(*) FROM pgjq.verify();
SQL
my ($qrc, $qout) = run_cmd(as_user_argv("$pgbin/psql", '-X', '-qAt', '-v', 'ON_ERROR_STOP=1',
	'-h', $sock, '-p', '5432', '-d', 'postgres', map { ('-c', $_) } split /\n/, $sql));
ok($qrc == 0, 'CREATE EXTENSION pgjq, enqueue, claim, complete') or diag($qout);
is($qout, "$version\n\n1\n1\nt\n0\n", "extversion $version; one job enqueued, claimed and completed; verify() clean");

run_ok('server stopped', as_user_argv("$pgbin/pg_ctl", '-D', $pgdata, '-m', 'fast', '-w', 'stop'));
$pgdata = undef;

note('total: ' . elapsed($T0) . ' s');
done_testing();

sub stop_here {
	diag("$_[0]: the remaining steps are not run");
	done_testing();
	exit 1;
}

sub as_user_argv {
	return $user ? ('runuser', '-u', $user, '--', @_) : @_;
}

sub as_user {
	return run_cmd(as_user_argv(@_));
}
