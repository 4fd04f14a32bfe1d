
# Copyright (c) pgjq contributors
#
# A database created after the server started gets its worker at once
# (test/BUGS.md, "A new database waits for its worker").
#
# pgjq.database_names lists a database that does not exist yet; the launcher
# finds it missing and looks it up again only every pgjq.max_sleep (10 s,
# the default, kept here so that a launcher that just waits for its next
# look fails the test).  CREATE DATABASE, then CREATE EXTENSION pgjq in it:
# the extension's commit wakes the launcher, which starts the database's
# worker; a job delayed by 0.2 s is promoted by that worker within 2 s of
# CREATE EXTENSION.  Likewise a database that a reload adds to
# pgjq.database_names (the launcher rereads the setting on SIGHUP).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $bound = 2;    # seconds from CREATE EXTENSION's return

my $node = PostgreSQL::Test::Cluster->new('new_database');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'late_db'
});
$node->start;

# Poll $sql in $db until it returns 't'; the seconds it took from $t0, or
# undef after 60 s.
sub seconds_until
{
	my ($db, $sql, $t0) = @_;
	for (1 .. 3000)
	{
		return time - $t0 if $node->safe_psql($db, $sql) eq 't';
		usleep(20_000);
	}
	return undef;
}

# The launcher has looked for late_db once and found it missing.
$node->wait_for_log(qr/database "late_db" listed in pgjq.database_names does not exist/);

$node->safe_psql('postgres', 'CREATE DATABASE late_db');
$node->safe_psql('late_db', 'CREATE EXTENSION pgjq');
my $t0 = time;
my $id = $node->safe_psql('late_db',
	q{SELECT pgjq.create_queue('q'); SELECT pgjq.enqueue('q', '{}', delay => '0.2 s')});
my $took = seconds_until('late_db', "SELECT state = 'ready' FROM pgjq.job($id)", $t0);
ok(defined $took && $took < $bound,
	"a database created after start: its delayed job is promoted within $bound s of CREATE EXTENSION")
  or diag('took ' . ($took // 'over 60') . ' s');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'late_db'"
	),
	'1',
	'... by its worker');

# a reload that lists one more database: its worker starts at once
$node->safe_psql('postgres', 'CREATE DATABASE listed_db');
$node->safe_psql('listed_db', 'CREATE EXTENSION pgjq');
$id = $node->safe_psql('listed_db',
	q{SELECT pgjq.create_queue('q'); SELECT pgjq.enqueue('q', '{}', delay => '0.2 s')});
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET pgjq.database_names = 'late_db, listed_db'; SELECT pg_reload_conf()});
$t0 = time;
$took = seconds_until('listed_db', "SELECT state = 'ready' FROM pgjq.job($id)", $t0);
ok(defined $took && $took < $bound,
	"a database added by a reload: its delayed job is promoted within $bound s")
  or diag('took ' . ($took // 'over 60') . ' s');

$node->stop;
done_testing();
