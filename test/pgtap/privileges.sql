-- Privileges: nothing in schema pgjq is usable by PUBLIC; the NOLOGIN roles
-- pgjq_producer, pgjq_worker and pgjq_admin hold exactly the grants that
-- docs/decisions.md lists, and a member of each can do its job and nothing
-- more.  Run by test/run with pg_prove.

\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off

BEGIN;
SELECT plan(40);

-- ----------------------------------------------------------------- PUBLIC

SELECT is_empty(
	$$SELECT p.oid::regprocedure::text
		FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND a.grantee = 0$$,
	'no pgjq function is executable by PUBLIC');
SELECT is_empty(
	$$SELECT c.oid::regclass::text || ' ' || a.privilege_type
		FROM pg_class c,
			 aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char",
													  c.relowner))) a
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
		 AND a.grantee = 0$$,
	'no pgjq table, view or sequence is usable by PUBLIC');
SELECT is_empty(
	$$SELECT a.privilege_type
		FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
	   WHERE n.nspname = 'pgjq' AND a.grantee = 0$$,
	'PUBLIC has no privilege on schema pgjq');
-- A new role with no grants can call nothing.
CREATE ROLE pgjq_test_nobody NOLOGIN;
SELECT is_empty(
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace
		 AND has_function_privilege('pgjq_test_nobody', p.oid, 'EXECUTE')$$,
	'a role without grants can execute no pgjq function');
SELECT is_empty(
	$$SELECT c.oid::regclass::text FROM pg_class c
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
		 AND has_table_privilege('pgjq_test_nobody', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')$$,
	'a role without grants can use no pgjq table or view');

-- ------------------------------------------------- what each role may run

-- The public functions and procedures each role can execute, directly or
-- through membership.  Internal helpers (pgjq._name) are left out here: a
-- view may need one of them executable by the roles that read it.
CREATE FUNCTION pg_temp.executable(r name) RETURNS SETOF text LANGUAGE sql AS $$
	SELECT p.oid::regprocedure::text FROM pg_proc p
	 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname !~ '^_'
	   AND has_function_privilege(r, p.oid, 'EXECUTE')
$$;

SELECT set_eq(
	$$SELECT * FROM pg_temp.executable('pgjq_producer')$$,
	ARRAY[
		'pgjq.enqueue(text,jsonb,interval,timestamp with time zone,integer,text,text,integer,interval,text,interval,text,interval,bigint[],text)',
		'pgjq.enqueue_many(text,jsonb[],interval,timestamp with time zone,integer,text[],text[],interval,text,interval,text,interval,jsonb[],text)',
		'pgjq.cancel(bigint)',
		'pgjq.cancel_many(bigint[])',
		'pgjq.cancel_key(text,text)',
		'pgjq.job(bigint)',
		'pgjq.wait_jobs(bigint[],interval,boolean)'],
	'pgjq_producer can execute enqueue, enqueue_many, cancel (one, many, by key), job and wait_jobs, nothing else');
SELECT set_eq(
	$$SELECT * FROM pg_temp.executable('pgjq_worker')$$,
	ARRAY[
		'pgjq.claim(text,integer,interval,text,interval)',
		'pgjq.claim(text[],integer,interval,text,interval)',
		'pgjq.await(text[],interval)',
		'pgjq.complete(bigint,bigint,jsonb)',
		'pgjq.complete(bigint[],bigint[],jsonb[])',
		'pgjq.complete_and_claim(text,bigint[],bigint[],integer,interval,text,text[],jsonb[])',
		'pgjq.fail(bigint,bigint,text,interval,interval)',
		'pgjq.hold_key(text,text,timestamp with time zone)',
		'pgjq.release_key(text,text)',
		'pgjq.heartbeat(bigint,bigint,interval)',
		'pgjq.snooze(bigint,bigint,interval)',
		'pgjq.job(bigint)',
		'pgjq.wait_jobs(bigint[],interval,boolean)'],
	'pgjq_worker can execute claim (both forms), await, complete (both forms), complete_and_claim, fail, hold_key, release_key, heartbeat, snooze, job and wait_jobs, nothing else');
SELECT set_eq(
	$$SELECT * FROM pg_temp.executable('pgjq_admin')$$,
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname !~ '^_'$$,
	'pgjq_admin can execute every public pgjq function and procedure');
SELECT set_eq(
	$$SELECT * FROM pg_temp.executable('pg_monitor')$$,
	ARRAY['pgjq.metrics(text)', 'pgjq.metrics_prometheus(text)'],
	'pg_monitor can execute metrics and metrics_prometheus, nothing else');
SELECT is_empty(
	$$SELECT c.oid::regclass::text || ' ' || a.privilege_type
		FROM pg_class c,
			 aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char",
													  c.relowner))) a
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND a.grantee = 'pg_monitor'::regrole$$,
	'pg_monitor has no privilege on any pgjq relation');

-- Relations: the three roles may SELECT queue_stats and nothing else; none
-- may write anywhere or touch a sequence.
SELECT set_eq(
	$$SELECT r::text || ' ' || c.oid::regclass::text
		FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin']::name[]) r, pg_class c
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
		 AND has_table_privilege(r, c.oid, 'SELECT')$$,
	ARRAY['pgjq_producer pgjq.queue_stats', 'pgjq_worker pgjq.queue_stats', 'pgjq_admin pgjq.queue_stats'],
	'the pgjq roles can SELECT pgjq.queue_stats and no other relation');
SELECT is_empty(
	$$SELECT r::text || ' ' || c.oid::regclass::text
		FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin']::name[]) r, pg_class c
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
		 AND has_table_privilege(r, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')$$,
	'the pgjq roles cannot write to any pgjq relation');
SELECT is_empty(
	$$SELECT r::text || ' ' || c.oid::regclass::text
		FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin']::name[]) r, pg_class c
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind = 'S'
		 AND has_sequence_privilege(r, c.oid, 'USAGE, SELECT, UPDATE')$$,
	'the pgjq roles cannot use any pgjq sequence');
SELECT is_empty(
	$$SELECT r::text || ' ' || a.attrelid::regclass::text || '.' || a.attname
		FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin']::name[]) r, pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
		 AND has_column_privilege(r, a.attrelid, a.attnum, 'SELECT, INSERT, UPDATE, REFERENCES')$$,
	'the pgjq roles have no column privileges on pgjq tables');
SELECT set_eq(
	$$SELECT r::text FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin']::name[]) r
	   WHERE has_schema_privilege(r, 'pgjq', 'USAGE') AND NOT has_schema_privilege(r, 'pgjq', 'CREATE')$$,
	ARRAY['pgjq_producer', 'pgjq_worker', 'pgjq_admin'],
	'the pgjq roles have USAGE on schema pgjq, and not CREATE');

-- ------------------------------------------------ members doing their job

-- run_as(role, sql): runs sql as role and returns 'ok' or the SQLSTATE of
-- the error it raised.  pgTAP's own calls must not run under SET ROLE (its
-- bookkeeping tables belong to the superuser), hence this wrapper.
CREATE FUNCTION pg_temp.run_as(r name, q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	st text := 'ok';
BEGIN
	EXECUTE format('SET LOCAL ROLE %I', r);
	BEGIN
		EXECUTE q;
	EXCEPTION WHEN OTHERS THEN
		st := SQLSTATE;
	END;
	RESET ROLE;
	RETURN st;
END
$$;

CREATE ROLE pgjq_test_producer LOGIN IN ROLE pgjq_producer;
CREATE ROLE pgjq_test_worker LOGIN IN ROLE pgjq_worker;
CREATE ROLE pgjq_test_admin LOGIN IN ROLE pgjq_admin;

SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT pgjq.create_queue('privq')$$), 'ok',
	'an admin can create a queue');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT pgjq.create_queue('privq2')$$), '42501',
	'a producer cannot create a queue');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.create_queue('privq2')$$), '42501',
	'a worker cannot create a queue');
SELECT is(pg_temp.run_as('pgjq_test_producer',
		$$CREATE TEMP TABLE ids AS SELECT pgjq.enqueue('privq', '{"n":1}') AS id$$), 'ok',
	'a producer can enqueue');
SELECT is(pg_temp.run_as('pgjq_test_producer',
		$$SELECT pgjq.enqueue_many('privq', ARRAY['{"n":2}', '{"n":3}']::jsonb[])$$), 'ok',
	'a producer can enqueue_many');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT pgjq.claim('privq')$$), '42501',
	'a producer cannot claim');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT * FROM pgjq.job$$), '42501',
	'a producer cannot read pgjq.job');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT * FROM pgjq.queue_stats$$), 'ok',
	'a producer can read queue_stats');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT * FROM pgjq.queue_stats$$), 'ok',
	'a worker can read queue_stats');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT * FROM pgjq.queue_stats$$), 'ok',
	'an admin can read queue_stats');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT * FROM pgjq.list_queues()$$), 'ok',
	'an admin can list queues');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT * FROM pgjq.list_queues()$$), '42501',
	'a producer cannot list queues');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.enqueue('privq')$$), '42501',
	'a worker cannot enqueue');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$CREATE TEMP TABLE leases AS SELECT id, token FROM pgjq.claim('privq', 2)$$), 'ok',
	'a worker can claim');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.claim(ARRAY['privq'], 1)$$), 'ok',
	'a worker can claim from a list of queues');
SELECT is((SELECT count(*) FROM pg_temp.leases), 2::bigint, 'the worker got two jobs');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.heartbeat(id, token) FROM pg_temp.leases$$), 'ok',
	'a worker can heartbeat');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.complete(id, token) FROM pg_temp.leases$$), 'ok',
	'a worker can complete');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.cancel(1)$$), '42501',
	'a worker cannot cancel');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$UPDATE pgjq.job SET priority = 0$$), '42501',
	'a worker cannot write pgjq.job');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.rescue()$$), '42501',
	'a worker cannot run maintenance');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT pgjq.maintain()$$), 'ok',
	'an admin can run maintenance');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT * FROM pgjq.job$$), '42501',
	'an admin cannot read the tables directly either');
SELECT is(pg_temp.run_as('pgjq_test_nobody', $$SELECT pgjq.job(1)$$), '42501',
	'a role without grants cannot call job()');

SELECT results_eq(
	$$SELECT completed FROM pgjq.queue_stats WHERE queue = 'privq'$$,
	ARRAY[2::bigint],
	'the jobs completed through the worker role are completed');

SELECT * FROM finish();
ROLLBACK;
