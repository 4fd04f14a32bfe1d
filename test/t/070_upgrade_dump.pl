
# Copyright (c) pgjq contributors
#
# Upgrades, dumps and restores keep every job:
#
# 1. ALTER EXTENSION pgjq UPDATE from 0.1.0 (its script is kept in sql/) on a
#    database holding ready, scheduled, running, dead, cancelled and
#    completed jobs, written as 0.1.0's library wrote them (this library
#    refuses a 0.1.0 schema with a hint to update): each keeps its state, the
#    running job is adopted by the ring and completes with its token, the
#    ready ones are moved into the ring by the next claim, the scheduled one
#    is promoted on time by the background worker,
#    dead ones can be redriven, dedup keys still hold.  The updated schema is
#    then compared, object by object, with a new installation of the current
#    version, so an upgrade script that forgets a change fails here.  The
#    same for an update from 0.2.0 (its ring tables read back after a
#    restart as 0.2.0 wrote them) and from 0.3.0 (0.4.0 adds the Citus mode:
#    on a single server the update must change no job and no behaviour, and
#    the library serves a 0.3.0 schema until it runs).
# 2. pg_dump, then pg_restore into a new database: queues, unfinished, dead
#    and finished jobs come back and work (claim, complete with new tokens),
#    and the id and token sequences continue above the restored values.
# 3. META.json (PGXN) agrees with pgjq.control.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

# ------------------------------------------------------------ 3. META.json

my ($control_version) = slurp_file('pgjq.control') =~ /^default_version = '([^']+)'/m;
ok($control_version, "pgjq.control names a version ($control_version)");
my $meta = decode_json(slurp_file('META.json'));
for my $field (qw(name abstract version maintainer license provides meta-spec))
{
	ok(defined $meta->{$field}, "META.json has the required field $field");
}
is($meta->{name}, 'pgjq', 'META.json: name');
is($meta->{version}, $control_version, 'META.json: version agrees with pgjq.control');
is($meta->{provides}{pgjq}{version}, $control_version,
	'META.json: provides.pgjq.version agrees with pgjq.control');
ok(-f $meta->{provides}{pgjq}{file}, 'META.json: provides.pgjq.file exists');
is($meta->{'meta-spec'}{version}, '1.0.0', 'META.json: meta-spec 1.0.0');
like($meta->{version}, qr/^\d+\.\d+\.\d+$/, 'META.json: a semantic version');
ok(defined $meta->{prereqs}{runtime}{requires}{PostgreSQL},
	'META.json: requires a PostgreSQL version');
ok(-f "sql/pgjq--0.1.0.sql", 'the 0.1.0 script is kept');
ok(-f "sql/pgjq--0.2.0.sql" && -f "sql/pgjq--0.3.0.sql", 'the 0.2.0 and 0.3.0 scripts are kept');
ok(-f "sql/pgjq--0.1.0--0.2.0.sql" && -f "sql/pgjq--0.2.0--0.3.0.sql" && -f "sql/pgjq--0.3.0--0.4.0.sql"
	  && -f "sql/pgjq--0.4.0.sql" && -f "sql/pgjq--0.4.0--0.4.1.sql" && $control_version eq '0.4.1',
	"update scripts lead from 0.1.0 through 0.2.0, 0.3.0 and 0.4.0 to $control_version");

# ------------------------------------------------------------------ server

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'upg,upg2,upg3,upg4'
pgjq.max_sleep = '1s'
pgjq.prune_interval = '1h'
});
$node->start;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

sub state_of { my ($db, $id) = @_; return sql($db, "SELECT state FROM pgjq.job($id)"); }

# A fingerprint of everything the extension defines in schema pgjq (partitions
# made at run time aside), one line per object, sorted.
my $schema_query = q{
SELECT string_agg(x, E'\n' ORDER BY x) FROM (
  SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid))
         || ' acl=' || coalesce(p.proacl::text, '') || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '')
    FROM pg_proc p WHERE p.pronamespace = 'pgjq'::regnamespace
  UNION ALL
  SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, '')
         || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
         || ' options=' || coalesce(c.reloptions::text, '')
    FROM pg_class c
   WHERE c.relnamespace = 'pgjq'::regnamespace AND NOT c.relispartition
     AND NOT EXISTS (SELECT FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
                      WHERE i.indexrelid = c.oid AND t.relispartition)
  UNION ALL
  SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
         || ' collation=' || a.attcollation::regcollation::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE c.relnamespace = 'pgjq'::regnamespace AND NOT c.relispartition AND c.relkind IN ('r', 'p', 'v', 'c')
     AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
   WHERE t.relnamespace = 'pgjq'::regnamespace AND NOT t.relispartition
  UNION ALL
  SELECT 'constraint ' || con.conrelid::regclass::text || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
    FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid
   WHERE t.relnamespace = 'pgjq'::regnamespace AND NOT t.relispartition
  UNION ALL
  SELECT 'view ' || c.relname || ' ' || md5(pg_get_viewdef(c.oid))
    FROM pg_class c WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind = 'v'
  UNION ALL
  SELECT 'type ' || t.typname || ' ' || t.typtype::text
    FROM pg_type t WHERE t.typnamespace = 'pgjq'::regnamespace AND t.typtype <> 'b'
     AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relispartition)
  UNION ALL
  SELECT 'config ' || string_agg(c::regclass::text, ',' ORDER BY c::regclass::text)
    FROM pg_extension e, unnest(e.extconfig) c WHERE e.extname = 'pgjq'
  UNION ALL
  SELECT 'sequence ' || s.seqrelid::regclass::text || ' ' || format_type(s.seqtypid, NULL)
         || ' start=' || s.seqstart || ' increment=' || s.seqincrement || ' min=' || s.seqmin
         || ' max=' || s.seqmax || ' cache=' || s.seqcache || ' cycle=' || s.seqcycle
    FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = 'pgjq'::regnamespace
  UNION ALL
  SELECT 'not a member of the extension: ' || pg_describe_object(o.classid, o.objid, 0)
    FROM (SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p WHERE p.pronamespace = 'pgjq'::regnamespace
          UNION ALL
          SELECT 'pg_class'::regclass, c.oid FROM pg_class c
           WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
             AND NOT c.relispartition
          UNION ALL
          SELECT 'pg_type'::regclass, t.oid FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid
           WHERE t.typnamespace = 'pgjq'::regnamespace AND c.relkind = 'c') o(classid, objid)
   WHERE NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = o.classid AND d.objid = o.objid
                        AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')
  UNION ALL
  SELECT 'schema acl=' || coalesce(n.nspacl::text, '') FROM pg_namespace n WHERE n.nspname = 'pgjq'
) s(x)};

# Compares two schema fingerprints; a difference shows the lines only one
# of them has.
sub schema_is
{
	my ($got, $want, $name) = @_;
	my %in_got = map { $_ => 1 } split /\n/, $got;
	my %in_want = map { $_ => 1 } split /\n/, $want;
	ok($got eq $want, $name)
	  or diag(join("\n", 'only in the one checked:', (grep { !$in_want{$_} } split /\n/, $got),
			'only in the new installation:', (grep { !$in_got{$_} } split /\n/, $want)));
}

# Every history partition has its own indexes (the parents have none): one
# BRIN in job_done's, two btrees in job_history's.
my $partition_index_query = q{
SELECT count(*) > 0 AND bool_and(n = CASE WHEN parent = 'job_done' THEN 1 ELSE 2 END)
  FROM (SELECT p.relname AS parent, (SELECT count(*) FROM pg_index i WHERE i.indrelid = h.inhrelid) AS n
          FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
         WHERE h.inhparent IN ('pgjq.job_done'::regclass, 'pgjq.job_history'::regclass)) x};

# Fill a database with one job in every state; returns the ids and tokens.
sub fill
{
	my ($db) = @_;
	my %j;
	sql($db, q{
SELECT pgjq.create_queue('u', lease => '10 minutes');
SELECT pgjq.create_queue('mortal', max_attempts => 1);
SELECT pgjq.create_queue('limited', concurrency => 2);
SELECT pgjq.create_queue('sleepy');
SELECT pgjq.pause('sleepy');
});
	$j{running} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"running\"}', priority => -1)");
	($j{running_token}) = split /\|/, sql($db, "SELECT token FROM pgjq.claim('u')");
	$j{completed} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"completed\"}', priority => -1)");
	sql($db, "SELECT pgjq.complete(id, token) FROM pgjq.claim('u')");
	$j{ready} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"ready\"}', dedup_key => 'once')");
	$j{ready2} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"ready2\"}', fair_key => 't1')");
	$j{scheduled} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"scheduled\"}', delay => '20 seconds')");
	$j{later} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"later\"}', delay => '1 hour')");
	$j{cancelled} = sql($db, "SELECT pgjq.enqueue('u', '{\"n\": \"cancelled\"}', delay => '1 hour')");
	sql($db, "SELECT pgjq.cancel($j{cancelled})");
	$j{dead} = sql($db, "SELECT pgjq.enqueue('mortal', '{\"n\": \"dead\"}')");
	sql($db, "SELECT pgjq.fail(id, token, 'boom') FROM pgjq.claim('mortal')");
	$j{limited} = sql($db, "SELECT pgjq.enqueue('limited', '{\"n\": \"limited\"}')");
	$j{paused} = sql($db, "SELECT pgjq.enqueue('sleepy', '{\"n\": \"paused\"}')");
	my %states = (running => 'running', completed => 'completed', ready => 'ready',
		ready2 => 'ready', scheduled => 'scheduled', later => 'scheduled',
		cancelled => 'cancelled', dead => 'dead', limited => 'ready', paused => 'ready');
	$j{states} = \%states;
	return \%j;
}

# The same jobs in a 0.1.0 schema, written as 0.1.0's library wrote them
# (this library serves 0.2.0's schema only and refuses a 0.1.0 one until
# the update): the queues, one row per unfinished job in pgjq.job (state
# 'r' ready, 's' scheduled, 'a' running with its token and lease), the
# completed job in job_done and the dead and cancelled ones in job_history,
# in the hour's partitions 0.1.0 made (its parents had partitioned indexes).
sub fill_010
{
	my ($db) = @_;
	my %j;
	sql($db, q{
INSERT INTO pgjq.queue (name, lease, max_attempts, backoff_base, backoff_max, retention, concurrency)
VALUES ('u', '10 minutes', 20, '1 second', '1 hour', '1 day', NULL),
       ('mortal', '30 seconds', 1, '1 second', '1 hour', '1 day', NULL),
       ('limited', '30 seconds', 20, '1 second', '1 hour', '1 day', 2),
       ('sleepy', '30 seconds', 20, '1 second', '1 hour', '1 day', NULL);
UPDATE pgjq.queue SET paused = true WHERE name = 'sleepy';
DO $$
DECLARE
	lo timestamptz := date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
	t text;
	n text;
BEGIN
	FOREACH t IN ARRAY ARRAY['job_done', 'job_history'] LOOP
		n := t || to_char(lo AT TIME ZONE 'UTC', '_YYYYMMDD_HH24');
		EXECUTE format('CREATE TABLE pgjq.%I PARTITION OF pgjq.%I FOR VALUES FROM (%L) TO (%L)',
					   n, t, lo, lo + interval '1 hour');
		INSERT INTO pgjq.history_partition (relname, parent, lower_bound, upper_bound)
		VALUES (n, t, lo, lo + interval '1 hour');
	END LOOP;
END
$$;
});
	my $job = sub {
		my ($queue, $state, $payload, %o) = @_;
		return sql($db, "INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key,"
			  . " attempt, max_attempts, token, enqueued_at, run_at, lease_until, cancel_requested, payload)"
			  . " SELECT nextval('pgjq.job_id_seq'), queue_id, '$state', " . ($o{priority} // 0) . ", "
			  . ($o{fair_key} ? "'$o{fair_key}'" : "''") . ", " . ($o{dedup_key} ? "'$o{dedup_key}'" : 'NULL')
			  . ", " . ($state eq 'a' ? 1 : 0) . ", max_attempts, "
			  . ($state eq 'a' ? "nextval('pgjq.token_seq')" : '0')
			  . ", now(), now() + interval '" . ($o{delay} // '0 s') . "', "
			  . ($state eq 'a' ? "now() + lease" : 'NULL')
			  . ", false, '{\"n\": \"$payload\"}' FROM pgjq.queue WHERE name = '$queue' RETURNING id");
	};
	$j{running} = $job->('u', 'a', 'running', priority => -1);
	$j{running_token} = sql($db, "SELECT token FROM pgjq.job WHERE id = $j{running}");
	$j{ready} = $job->('u', 'r', 'ready', dedup_key => 'once');
	$j{ready2} = $job->('u', 'r', 'ready2', fair_key => 't1');
	$j{scheduled} = $job->('u', 's', 'scheduled', delay => '20 seconds');
	$j{later} = $job->('u', 's', 'later', delay => '1 hour');
	$j{limited} = $job->('limited', 'r', 'limited');
	$j{paused} = $job->('sleepy', 'r', 'paused');
	$j{completed} = sql($db, q{
INSERT INTO pgjq.job_done (queue_id, finished_at, min_id, max_id, ids, attempts, enqueued_at)
SELECT queue_id, now(), i, i, ARRAY[i], ARRAY[1], ARRAY[now()]
  FROM pgjq.queue, nextval('pgjq.job_id_seq') i WHERE name = 'u' RETURNING min_id});
	$j{cancelled} = sql($db, q{
INSERT INTO pgjq.job_history (id, queue_id, state, priority, fair_key, attempt, max_attempts, token,
                              enqueued_at, finished_at)
SELECT nextval('pgjq.job_id_seq'), queue_id, 'x', 0, '', 0, 20, 0, now(), now()
  FROM pgjq.queue WHERE name = 'u' RETURNING id});
	$j{dead} = sql($db, q{
INSERT INTO pgjq.job_history (id, queue_id, state, priority, fair_key, attempt, max_attempts, token,
                              enqueued_at, finished_at, last_error, payload)
SELECT nextval('pgjq.job_id_seq'), queue_id, 'd', 0, '', 1, 1, nextval('pgjq.token_seq'), now(), now(),
       'boom', '{"n": "dead"}'
  FROM pgjq.queue WHERE name = 'mortal' RETURNING id});
	my %states = (running => 'running', completed => 'completed', ready => 'ready',
		ready2 => 'ready', scheduled => 'scheduled', later => 'scheduled',
		cancelled => 'cancelled', dead => 'dead', limited => 'ready', paused => 'ready');
	$j{states} = \%states;
	return \%j;
}

sub check_states
{
	my ($db, $j, $what) = @_;
	for my $k (sort keys %{ $j->{states} })
	{
		is(state_of($db, $j->{$k}), $j->{states}{$k}, "$what: the $k job is $j->{states}{$k}");
	}
}

# ---------------------------------------------------------------- 1. update

sql('postgres', 'CREATE DATABASE upg');
sql('upg', "CREATE EXTENSION pgjq VERSION '0.1.0'");
is(sql('upg', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	'0.1.0', 'installed at 0.1.0');
my $j = fill_010('upg');
check_states('upg', $j, 'before the update');
{
	my ($ret, $out, $err) = $node->psql('upg', "SELECT pgjq.enqueue('u')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:\s+55000:.*older than its library/,
		'before the update: a call that needs the ring raises 55000');
	like($err, qr/HINT:.*ALTER EXTENSION pgjq UPDATE/, '... with a hint to update');
}

sql('upg', 'ALTER EXTENSION pgjq UPDATE');
is(sql('upg', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	$control_version, "updated to $control_version");
check_states('upg', $j, 'after the update');
# the running job is the ring's now: its row in pgjq.job is gone
is(sql('upg', "SELECT count(*) FROM pgjq.job WHERE id = $j->{running}"), '0',
	'after the update: the running job was adopted by the ring');
is(sql('upg', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update: shared memory and the tables agree');
is(sql('upg', $partition_index_query), 't', 'after the update: every history partition has its indexes');

is(sql('upg', "SELECT pgjq.enqueue('u', dedup_key => 'once')"), $j->{ready},
	'after the update: a dedup_key still finds its unfinished job');
is(sql('upg', "SELECT pgjq.complete($j->{running}, $j->{running_token})"), 't',
	'after the update: the running job completes with the token it had');
is(sql('upg', "SELECT string_agg(id::text, ',' ORDER BY id) FROM pgjq.claim('u', 10)"),
	join(',', sort { $a <=> $b } ($j->{ready}, $j->{ready2})),
	'after the update: the ready jobs are claimed, nothing else');
ok( $node->poll_query_until('upg',
		"SELECT state = 'ready' FROM pgjq.job($j->{scheduled})"),
	'after the update: the worker promotes the scheduled job');
is(sql('upg', "SELECT clock_timestamp() - run_at < interval '10 seconds' FROM pgjq.job($j->{scheduled})"),
	't', 'after the update: promoted within 10 s of due');
is(sql('upg', "SELECT pgjq.retry_dead('mortal')"), '1', 'after the update: the dead job is redriven');
is(sql('upg', "SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('mortal')"), '1',
	'after the update: the redriven job is claimed and completed');
is(sql('upg', "SELECT count(*) FROM pgjq.claim('sleepy')"), '0', 'after the update: a paused queue stays paused');
is(sql('upg', "SELECT count(*) FROM pgjq.claim('limited', 5)"), '1',
	'after the update: a queue with limits still hands out its job');

sql('postgres', 'CREATE DATABASE fresh');
sql('fresh', 'CREATE EXTENSION pgjq');
my $updated = sql('upg', $schema_query);
my $fresh = sql('fresh', $schema_query);
ok(length($fresh) > 1000, 'the schema fingerprint covers the objects');
schema_is($updated, $fresh, 'an updated installation has the same schema as a new one');

# ------------------------------------------------- 1b. update from 0.2.0

# A 0.2.0 installation with a job in every state, its ring tables as 0.2.0's
# library left them: no 'g' rows (this library writes them; they are taken
# out, and the restart makes the first rebuild read 0.2.0's tables).
sql('postgres', 'CREATE DATABASE upg2');
sql('upg2', "CREATE EXTENSION pgjq VERSION '0.2.0'");
is(sql('upg2', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	'0.2.0', 'installed at 0.2.0');
my $j2 = fill('upg2');
sql('upg2', "SELECT pgjq.create_queue('flow')");
my $dep2 = sql('upg2', "SELECT pgjq.enqueue('flow', '{\"step\": 1}')");
my $waiter2 = sql('upg2', "SELECT pgjq.enqueue('flow', '{\"step\": 2}', after => ARRAY[$dep2]::bigint[])");
sql('upg2', "DELETE FROM pgjq.ring_log_$_ WHERE kind = 'g'") for 0 .. 3;
$node->restart;
check_states('upg2', $j2, '0.2.0, its tables read back after a restart');
is(sql('upg2', "SELECT state FROM pgjq.job($waiter2)"), 'waiting', '0.2.0: the waiting job waits');

sql('upg2', 'ALTER EXTENSION pgjq UPDATE');
is(sql('upg2', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	$control_version, "0.2.0 updated to $control_version");
check_states('upg2', $j2, 'after the update from 0.2.0');
is(sql('upg2', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update from 0.2.0: shared memory and the tables agree');
is(sql('upg2', "SELECT pgjq.complete($j2->{running}, $j2->{running_token})"), 't',
	'after the update from 0.2.0: the running job completes with its token');
is(sql('upg2', "SELECT string_agg(id::text, ',' ORDER BY id) FROM pgjq.claim('u', 10)"),
	join(',', sort { $a <=> $b } ($j2->{ready}, $j2->{ready2})),
	'after the update from 0.2.0: the ready jobs are claimed, nothing else');
ok( $node->poll_query_until('upg2',
		"SELECT state = 'ready' FROM pgjq.job($j2->{scheduled})"),
	'after the update from 0.2.0: the worker promotes the scheduled job');
is(sql('upg2', "SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('flow', 10)"), '1',
	'after the update from 0.2.0: the dependency is claimed and completed');
ok($node->poll_query_until('upg2', "SELECT state = 'ready' FROM pgjq.job($waiter2)"),
	'after the update from 0.2.0: the waiting job is released by the worker');
is(sql('upg2', q{SELECT count(*) > 0 FROM (SELECT kind FROM pgjq.ring_log_0 UNION ALL SELECT kind FROM pgjq.ring_log_1
	UNION ALL SELECT kind FROM pgjq.ring_log_2 UNION ALL SELECT kind FROM pgjq.ring_log_3) l WHERE kind = 'g'}),
	't', "after the update from 0.2.0: the current slot has its 'g' row");
$node->restart;
check_states('upg2', { states => { dead => 'dead', cancelled => 'cancelled', later => 'scheduled',
	completed => 'completed', running => 'completed' }, map { $_ => $j2->{$_} } qw(dead cancelled later completed running) },
	'after the update from 0.2.0 and a restart');
is(sql('upg2', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update from 0.2.0 and a restart: shared memory and the tables agree');
schema_is(sql('upg2', $schema_query), $fresh, 'an installation updated from 0.2.0 has the schema of a new one');

# ------------------------------------------------- 1c. update from 0.3.0

# A 0.3.0 installation with a job in every state and a waiting one.  0.4.0
# adds the Citus mode (queue_fence, the queue-first *_in forms, route(),
# citus_setup(), move_queues(), job(id)'s guard branch); on a single server
# none of it may change a job or a call.  This library serves the 0.3.0
# schema as it is until the update: the jobs are read back after a restart
# and a job runs through before the update.
sql('postgres', 'CREATE DATABASE upg3');
sql('upg3', "CREATE EXTENSION pgjq VERSION '0.3.0'");
is(sql('upg3', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	'0.3.0', 'installed at 0.3.0');
my $j3 = fill('upg3');
sql('upg3', "SELECT pgjq.create_queue('flow')");
my $dep3 = sql('upg3', "SELECT pgjq.enqueue('flow', '{\"step\": 1}')");
my $waiter3 = sql('upg3', "SELECT pgjq.enqueue('flow', '{\"step\": 2}', after => ARRAY[$dep3]::bigint[])");
$node->restart;
check_states('upg3', $j3, '0.3.0, its tables read back after a restart');
is(sql('upg3', "SELECT state FROM pgjq.job($waiter3)"), 'waiting', '0.3.0: the waiting job waits');
is(sql('upg3', 'SELECT count(*) FROM pgjq.verify()'), '0', '0.3.0: shared memory and the tables agree');
sql('upg3', "SELECT pgjq.create_queue('pre')");
my $pre3 = sql('upg3', "SELECT pgjq.enqueue('pre', '{\"n\": \"pre\"}')");
is(sql('upg3', "SELECT pgjq.complete(id, token) FROM pgjq.claim('pre')"), 't',
	'0.3.0 before the update: this library enqueues, claims and completes');
my $max_id3 = sql('upg3', 'SELECT last_value FROM pgjq.job_id_seq');

sql('upg3', 'ALTER EXTENSION pgjq UPDATE');
is(sql('upg3', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	$control_version, "0.3.0 updated to $control_version");
check_states('upg3', $j3, 'after the update from 0.3.0');
is(sql('upg3', "SELECT state FROM pgjq.job($pre3)"), 'completed',
	'after the update from 0.3.0: the job completed before it is completed');
is(sql('upg3', "SELECT state || ' ' || waiting_for::text FROM pgjq.job($waiter3)"), "waiting {$dep3}",
	'after the update from 0.3.0: the waiting job still waits for its dependency');
is(sql('upg3', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update from 0.3.0: shared memory and the tables agree');
is(sql('upg3', "SELECT pgjq.enqueue('u', dedup_key => 'once')"), $j3->{ready},
	'after the update from 0.3.0: a dedup_key still finds its unfinished job');
# ids go on where they were: the (group + 1) << 48 ranges are citus_setup()'s
my $new3 = sql('upg3', "SELECT pgjq.enqueue('pre', '{\"n\": \"new\"}')");
ok($new3 > $max_id3 && $new3 < 2**48,
	"after the update from 0.3.0: a new id ($new3) follows the old ones, below 2^48");
is(sql('upg3', "SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('pre')"), '1',
	'after the update from 0.3.0: the new job is claimed and completed');
is(sql('upg3', "SELECT pgjq.complete($j3->{running}, $j3->{running_token})"), 't',
	'after the update from 0.3.0: the running job completes with its token');
# the queue-first forms are the plain ones on a single server
my @c3 = map { [ split /\|/ ] } split /\n/,
  sql('upg3', "SELECT id, token FROM pgjq.claim('u', 10) ORDER BY id");
is(join(',', map { $_->[0] } @c3), join(',', sort { $a <=> $b } ($j3->{ready}, $j3->{ready2})),
	'after the update from 0.3.0: the ready jobs are claimed, nothing else');
is(sql('upg3', "SELECT state FROM pgjq.job_in('u', $c3[0][0])"), 'running',
	'after the update from 0.3.0: job_in() reports a claimed job');
is(sql('upg3', "SELECT pgjq.heartbeat_in('u', $c3[0][0], $c3[0][1]) > now()"), 't',
	'after the update from 0.3.0: heartbeat_in() extends its lease');
is(sql('upg3', "SELECT pgjq.complete_in('u', ARRAY[" . join(',', map { $_->[0] } @c3) . "]::bigint[], ARRAY["
	  . join(',', map { $_->[1] } @c3) . "]::bigint[])"), scalar(@c3),
	'after the update from 0.3.0: complete_in() completes them with their tokens');
is(sql('upg3', "SELECT pgjq.cancel_in('u', ARRAY[$j3->{later}]::bigint[])"), '1',
	'after the update from 0.3.0: cancel_in() cancels a scheduled job');
{
	my ($ret, $out, $err) = $node->psql('upg3', "SELECT * FROM pgjq.route('u')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:\s+55000:.*route\(\) needs pgjq on Citus/,
		'after the update from 0.3.0: route() says a single server is no Citus cluster (55000)');
}
ok( $node->poll_query_until('upg3',
		"SELECT state = 'ready' FROM pgjq.job($j3->{scheduled})"),
	'after the update from 0.3.0: the worker promotes the scheduled job');
is(sql('upg3', "SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('flow', 10)"), '1',
	'after the update from 0.3.0: the dependency is claimed and completed');
ok($node->poll_query_until('upg3', "SELECT state = 'ready' FROM pgjq.job($waiter3)"),
	'after the update from 0.3.0: the waiting job is released by the worker');
is(sql('upg3', "SELECT pgjq.retry_dead('mortal')"), '1', 'after the update from 0.3.0: the dead job is redriven');
is(sql('upg3', "SELECT pgjq.fail_in('mortal', id, token, 'boom again') FROM pgjq.claim('mortal')"), 'dead',
	'after the update from 0.3.0: fail_in() fails the redriven job, dead again');
is(sql('upg3', "SELECT count(*) FROM pgjq.claim('sleepy')"), '0',
	'after the update from 0.3.0: a paused queue stays paused');
is(sql('upg3', "SELECT count(*) FROM pgjq.claim('limited', 5)"), '1',
	'after the update from 0.3.0: a queue with limits still hands out its job');
$node->restart;
check_states('upg3', { states => { dead => 'dead', cancelled => 'cancelled', later => 'cancelled',
	completed => 'completed', running => 'completed', ready => 'completed', ready2 => 'completed' },
	map { $_ => $j3->{$_} } qw(dead cancelled later completed running ready ready2) },
	'after the update from 0.3.0 and a restart');
is(sql('upg3', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update from 0.3.0 and a restart: shared memory and the tables agree');
schema_is(sql('upg3', $schema_query), $fresh, 'an installation updated from 0.3.0 has the schema of a new one');

# ------------------------------------------------- 1d. update from 0.4.0

# 0.4.1 (issue 35) rebuilds the Citus mode's move and guard and adds the
# worker's lock against DDL (pgjq._exclude_worker, called first by the update
# script while the worker serves the database); on a single server no job and
# no call may change.
sql('postgres', 'CREATE DATABASE upg4');
sql('upg4', "CREATE EXTENSION pgjq VERSION '0.4.0'");
is(sql('upg4', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	'0.4.0', 'installed at 0.4.0');
my $j4 = fill('upg4');
check_states('upg4', $j4, '0.4.0 before the update');
sql('upg4', 'ALTER EXTENSION pgjq UPDATE');
is(sql('upg4', "SELECT extversion FROM pg_extension WHERE extname = 'pgjq'"),
	$control_version, "0.4.0 updated to $control_version");
check_states('upg4', $j4, 'after the update from 0.4.0');
is(sql('upg4', "SELECT pgjq.complete($j4->{running}, $j4->{running_token})"), 't',
	'after the update from 0.4.0: the running job completes with its token');
ok( $node->poll_query_until('upg4',
		"SELECT state = 'ready' FROM pgjq.job($j4->{scheduled})"),
	'after the update from 0.4.0: the worker promotes the scheduled job');
is(sql('upg4', 'SELECT count(*) FROM pgjq.verify()'), '0',
	'after the update from 0.4.0: shared memory and the tables agree');
schema_is(sql('upg4', $schema_query), $fresh, 'an installation updated from 0.4.0 has the schema of a new one');

# ------------------------------------------------------- 2. dump and restore

sql('postgres', 'CREATE DATABASE src');
sql('src', 'CREATE EXTENSION pgjq');
my $s = fill('src');
# a job waiting for another (enqueue(..., after)): its row and its open edge
sql('src', "SELECT pgjq.create_queue('flow')");
my $dep = sql('src', "SELECT pgjq.enqueue('flow', '{\"step\": 1}')");
my $waiter = sql('src', "SELECT pgjq.enqueue('flow', '{\"step\": 2}', after => ARRAY[$dep]::bigint[])");
my $max_id = sql('src', 'SELECT last_value FROM pgjq.job_id_seq');
my $max_token = sql('src', 'SELECT last_value FROM pgjq.token_seq');
my $queues = sql('src', 'SELECT string_agg(queue, \',\' ORDER BY queue) FROM pgjq.list_queues()');

my $dump = PostgreSQL::Test::Utils::tempdir . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('src'), '-f', $dump ], 'pg_dump of a database with pgjq');
sql('postgres', 'CREATE DATABASE dst');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst'), $dump ],
	'pg_restore into a new database, without errors');

is(sql('dst', 'SELECT string_agg(queue, \',\' ORDER BY queue) FROM pgjq.list_queues()'),
	$queues, 'after restore: the queues are back');
check_states('dst', $s, 'after restore');
is(sql('dst', $partition_index_query), 't', 'after restore: every history partition has its indexes');
is(sql('dst', "SELECT paused FROM pgjq.list_queues() WHERE queue = 'sleepy'"), 't',
	'after restore: the paused queue is still paused');
is(sql('dst', "SELECT pgjq.enqueue('u', dedup_key => 'once')"), $s->{ready},
	'after restore: a dedup_key still finds its unfinished job');
my @claimed = map { [ split /\|/ ] } split /\n/,
  sql('dst', "SELECT id, token FROM pgjq.claim('u', 10) ORDER BY id");
is(join(',', map { $_->[0] } @claimed), join(',', sort { $a <=> $b } ($s->{ready}, $s->{ready2})),
	'after restore: the ready jobs are claimed');
ok((!grep { $_->[1] <= $max_token } @claimed), 'after restore: new tokens are above every restored token');
is(sql('dst', "SELECT count(*) FILTER (WHERE pgjq.complete(id, token)) FROM (VALUES "
	  . join(',', map { "($_->[0]::bigint, $_->[1]::bigint)" } @claimed) . ") v(id, token)"),
	scalar(@claimed), 'after restore: they complete with their new tokens');
is(sql('dst', "SELECT pgjq.complete($s->{running}, $s->{running_token})"), 't',
	'after restore: the job that was running completes with its token');
my $new_id = sql('dst', "SELECT pgjq.enqueue('u', '{}')");
cmp_ok($new_id, '>', $max_id, 'after restore: new ids are above every restored id');
is(sql('dst', "SELECT pgjq.retry_dead('mortal')"), '1', 'after restore: the dead job is redriven');
is(sql('dst', "SELECT count(pgjq.complete(id, token)) FROM pgjq.claim('mortal')"), '1',
	'after restore: the redriven job is claimed and completed');
is(sql('dst', "SELECT count(*) FROM pgjq.claim('sleepy')"), '0', 'after restore: the paused queue hands out nothing');
is(sql('dst', "SELECT count(*) FROM pgjq.claim('limited', 5)"), '1',
	'after restore: a queue with limits hands out its job');
is(sql('dst', "SELECT state || ' ' || waiting_for::text FROM pgjq.job($waiter)"), "waiting {$dep}",
	'after restore: a waiting job still waits for its dependency');
is(sql('dst', "WITH c AS (SELECT * FROM pgjq.claim('flow', 10))"
	  . " SELECT string_agg(payload->>'step', ',') || ' ' || bool_and(pgjq.complete(id, token)) FROM c"),
	'1 true', 'after restore: only the dependency is claimable, and it completes');
sql('dst', 'SELECT pgjq.promote()');
is(sql('dst', "SELECT string_agg(payload->>'step', ',') FROM pgjq.claim('flow', 10)"), '2',
	'after restore: its completion releases the waiting job');
schema_is(sql('dst', $schema_query), $fresh, 'after restore: the schema is that of a new installation');

$node->stop;
done_testing();
