# PgjqCitus: a Citus cluster (a coordinator and two workers) with pgjq
# preloaded on every node, for the Citus tests (test/citus/*.pl).
#
#   use FindBin;
#   use lib "$FindBin::Bin/../perl";
#   use PgjqCitus;
#
#   plan skip_all => citus_skip_reason() unless citus_available();
#   my $c = citus_cluster();
#   $c->safe_psql(0, 'SELECT ...');     # node 0 = the coordinator
#   $c->kill9_worker(2);                 # nodes 1 and 2 = the workers
#
# Nodes are numbered as in ../shared/citus-spike/setup-cluster.sh; every
# method that takes a node also takes the PostgreSQL::Test::Cluster object.
# Tests connect through the nodes' Unix sockets as usual; the nodes also
# listen on 127.0.0.1, where Citus connects from node to node.
package PgjqCitus;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use PgjqTest ();

our @EXPORT = qw(citus_available citus_skip_reason citus_cluster);

# Where Citus connects between nodes (pg_dist_node's nodename).
my $host = '127.0.0.1';

# citus_available(): whether citus.so is installed for the PostgreSQL the
# tests run against (the first pg_config in PATH, as for the servers).
sub citus_available
{
	my $dir = `pg_config --pkglibdir`;
	return 0 if $? != 0;
	chomp $dir;
	return -f "$dir/citus.so" ? 1 : 0;
}

# citus_skip_reason(): the one line for plan skip_all when Citus is missing.
sub citus_skip_reason
{
	return
	  'Citus is not installed (citus.so): run test/citus-build "$(which pg_config)", '
	  . 'or test/run with PGJQ_CITUS_SRC set to citus-13.2.2.tar.gz';
}

# citus_cluster(%opts): starts the cluster and returns a PgjqCitus object,
# { coordinator => $node, workers => [$w1, $w2] }.  Options:
#   workers => N      how many workers (default 2)
#   conf => '...'     more postgresql.conf lines for every node
#   pgjq => 0         leave CREATE EXTENSION pgjq to the test
#   name => 'x'       node name prefix (default ''), for two clusters in a test
sub citus_cluster
{
	my (%opts) = @_;
	my $nworkers = $opts{workers} // 2;
	my $prefix = $opts{name} // '';
	my $self = bless { coordinator => undef, workers => [] }, __PACKAGE__;

	for my $n (0 .. $nworkers)
	{
		my $node = PostgreSQL::Test::Cluster->new(
			$prefix . ($n == 0 ? 'coordinator' : "worker$n"));
		$node->init;
		# initdb -A trust already trusts host 127.0.0.1/32 in pg_hba.conf.
		# Of test/pgjq.conf only its comment applies here: every setting
		# it makes (preload, database_names, prepared transactions) is
		# different on a Citus node.
		# Either order of the two libraries works (README): worker 2
		# preloads pgjq first (review 0.4.0 M1: that order once stopped
		# the server, "Citus has to be loaded first").
		my $preload = $n == 2 ? 'pgjq,citus' : 'citus,pgjq';
		$node->append_conf(
			'postgresql.conf', qq{
# added by PgjqCitus
listen_addresses = '$host'
shared_preload_libraries = '$preload'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '1s'
# Citus commits multi-node writes with two-phase commit
max_prepared_transactions = 64
# shard moves use logical replication
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
# Citus' maintenance daemon and pgjq's launcher and worker, and Citus'
# background tasks, on top of PostgreSQL's own
max_worker_processes = 32
max_connections = 100
citus.shard_replication_factor = 1
});
		$node->append_conf('postgresql.conf', $opts{conf}) if defined $opts{conf};
		$node->start;
		$node->safe_psql('postgres', 'CREATE EXTENSION citus');
		if ($n == 0)
		{
			$self->{coordinator} = $node;
		}
		else
		{
			push @{ $self->{workers} }, $node;
		}
	}

	my $coord = $self->{coordinator};
	$coord->safe_psql('postgres',
		"SELECT citus_set_coordinator_host('$host', " . $coord->port . ')');
	$coord->safe_psql('postgres', "SELECT citus_add_node('$host', " . $_->port . ')')
	  for @{ $self->{workers} };
	# Citus propagates the extension (and its roles) to the workers.
	$coord->safe_psql('postgres', 'CREATE EXTENSION pgjq')
	  if $opts{pgjq} // 1;
	return $self;
}

sub coordinator { return $_[0]->{coordinator}; }

# workers(): the worker nodes, in order.
sub workers { return @{ $_[0]->{workers} }; }

# nodes(): the coordinator, then the workers.
sub nodes
{
	my ($self) = @_;
	return ($self->{coordinator}, @{ $self->{workers} });
}

# node($n): node $n (0 = coordinator, 1.. = workers), or $n itself when it
# already is a node.
sub node
{
	my ($self, $n) = @_;
	return $n if ref $n;
	my @nodes = $self->nodes;
	die 'PgjqCitus: no node ' . ($n // 'undef')
	  unless defined $n && $n =~ /^\d+$/ && $nodes[$n];
	return $nodes[$n];
}

# node_port($n): the port node $n listens on, on 127.0.0.1 and its socket.
sub node_port { return $_[0]->node($_[1])->port; }

# connstr($n, $db): a libpq connection string to node $n over TCP, the way
# Citus reaches it (the default database is postgres).
sub connstr
{
	my ($self, $n, $db) = @_;
	return "host=$host port=" . $self->node_port($n) . ' dbname=' . ($db // 'postgres');
}

# psql($n, $sql, %params): PostgreSQL::Test::Cluster::psql on node $n's
# database postgres; in list context (exit code, stdout, stderr).
sub psql
{
	my ($self, $n, $sql, %params) = @_;
	return $self->node($n)->psql('postgres', $sql, %params);
}

# safe_psql($n, $sql, %params): the same, dying on error; returns stdout.
sub safe_psql
{
	my ($self, $n, $sql, %params) = @_;
	return $self->node($n)->safe_psql('postgres', $sql, %params);
}

# worker($n): worker $n (1-based), dying if there is none.
sub worker
{
	my ($self, $n) = @_;
	return $n if ref $n;
	die 'PgjqCitus: no worker ' . ($n // 'undef')
	  unless $n && $n =~ /^\d+$/ && $self->{workers}[ $n - 1 ];
	return $self->{workers}[ $n - 1 ];
}

# wait_ready($n): polls until node $n accepts connections over TCP, as Citus
# connects (up to 60 s); true when it does.
sub wait_ready
{
	my ($self, $n) = @_;
	my $node = $self->node($n);
	my $until = time + 60;
	while (time < $until)
	{
		my $ret = $node->psql('postgres', 'SELECT 1', connstr => $self->connstr($node));
		return 1 if $ret == 0;
		usleep(100_000);
	}
	return 0;
}

# stop_worker($n, $mode): stops worker $n (pg_ctl -m $mode, default fast).
sub stop_worker
{
	my ($self, $n, $mode) = @_;
	$self->worker($n)->stop($mode // 'fast');
	return;
}

# start_worker($n): starts worker $n again; true once it accepts connections.
sub start_worker
{
	my ($self, $n) = @_;
	$self->worker($n)->start;
	return $self->wait_ready($self->worker($n));
}

# kill9_worker($n, $down_secs): SIGKILL of worker $n's postmaster, then
# (after $down_secs more, default none) start it again; true once it
# accepts connections.  The children it leaves are waited for first: a new
# postmaster refuses to start while they hold the old shared memory.
sub kill9_worker
{
	my ($self, $n, $down_secs) = @_;
	my $node = $self->worker($n);
	return 0 unless PgjqTest::kill9_restart($node, $down_secs // 0);
	return $self->wait_ready($node);
}

# fails_with($n, $sql, $sqlstate, $re, $what): $sql fails on node $n with
# that SQLSTATE and a message matching $re (three assertions); returns the
# error text.
sub fails_with
{
	my ($self, $n, $sql, $state, $re, $what) = @_;
	my ($rc, $out, $err) = $self->psql($n, "\\set VERBOSITY verbose\n$sql");
	Test::More::isnt($rc, 0, "$what: refused");
	Test::More::like($err, qr/ERROR:\s+$state:/, "$what: SQLSTATE $state") or Test::More::diag($err);
	Test::More::like($err, $re, "$what: the message") or Test::More::diag($err);
	return $err;
}

# stop(): stops every node (fast); the test framework stops any left at exit.
sub stop
{
	my ($self) = @_;
	$_->stop('fast') for $self->nodes;    # a node already stopped is skipped
	return;
}

1;
