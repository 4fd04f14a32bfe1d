
# Copyright (c) pgjq contributors
#
# Promotion under load.  Producers and workers run against the primary
# (PgjqLoad: every pgjq call records what it did in a ledger table in the
# same statement, so the ledger and the jobs replicate together); the
# primary is killed with kill -9 mid-load and the streaming standby is
# promoted.  The new primary rebuilds its shared state (limit counters,
# wake-ups) from the tables, its pgjq worker rescues the leases that expire,
# and workers drain the queue on it.  Whatever part of the primary's last
# work did not reach the standby is lost as a whole (the job with its ledger
# row): on the new primary, every committed enqueue in the ledger exists and
# ends completed exactly once, no completed job is claimed again, no job is
# claimed while an earlier lease of it (granted on the old primary) is
# valid, and verify() finds shared memory and the tables in agreement.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgjqTest;
use PgjqLoad;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
max_connections = 40
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION pgjq');
# a concurrency limit makes the rebuilt counters matter
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $load = load_setup($primary, $tmp);
$primary->safe_psql('postgres', "SELECT pgjq.alter_queue('c', concurrency => 50)");

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;

my @bg = load_start($load);
my $target = load_count_done($load) + 500;
ok($primary->poll_query_until('postgres', "SELECT count(*) >= $target FROM done"),
	'the load makes progress on the primary');
$primary->wait_for_replay_catchup($standby) if $primary->can('wait_for_replay_catchup');

# kill -9 of the primary in the middle of the load, then promotion
$primary->kill9;
for my $bg (@bg)
{
	my $rc = bg_wait($bg, 120);
	bg_stop($bg) unless defined $rc;
	my @errors = load_errors($bg);
	is(scalar(@errors), 0, "$bg->{name} saw no SQL errors before the primary died")
	  or diag join("\n", @errors);
}
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby is promoted');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgjq worker' AND datname = 'postgres'",
		'1'),
	'the promoted standby runs the pgjq worker for postgres');

# the workers go on against the new primary until everything is done
my $load2 = { %$load, node => $standby };
load_drain($load2);
my $n = ledger_checks($load2, 'after promotion');
cmp_ok($n, '>', 300, 'a fair amount of work was produced before the promotion');
verify_ok($standby, 'postgres', 'on the promoted standby, shared memory and the tables agree');

$standby->stop;
done_testing();
