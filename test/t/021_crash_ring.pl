
# Copyright (c) pgjq contributors
#
# The crash test of 020_crash.pl with every queue on the ring engine
# (pgjq.engine = 'ring'): 20 kill -9s of the postmaster under load, a backend
# and the pgjq worker killed, a lease that spans a crash; nothing committed is
# lost, nothing completed comes back, no job is held twice with valid leases.
# The ring's state is rebuilt from its tables after every crash.

use strict;
use warnings;
use FindBin;
# loaded here, at compile time: their INIT blocks must run before 020's code
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

$ENV{PGJQ_CRASH_ENGINE} = 'ring';
my $file = "$FindBin::Bin/020_crash.pl";
unless (my $rc = do $file)
{
	die "021_crash_ring: $file: $@" if $@;
}
