# PgjqTest: helpers shared by pgjq's TAP tests (test/t/*.pl).
#
#   use FindBin;
#   use lib "$FindBin::Bin/../perl";
#   use PgjqTest;
package PgjqTest;

use strict;
use warnings;

use Exporter 'import';
use Test::More;

our @EXPORT = qw(verify_ok);

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

1;
