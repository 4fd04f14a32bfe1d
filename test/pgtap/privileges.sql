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
SELECT plan(61);

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
		'pgjq.wait_jobs(bigint[],interval,boolean)',
		'pgjq.cancel_in(text,bigint[])',
		'pgjq.job_in(text,bigint)',
		'pgjq.route(text)'],
	'pgjq_producer can execute enqueue, enqueue_many, cancel (one, many, by key), job, wait_jobs and the Citus mode''s cancel_in, job_in and route, nothing else');
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
		'pgjq.wait_jobs(bigint[],interval,boolean)',
		'pgjq.complete_in(text,bigint[],bigint[],jsonb[])',
		'pgjq.fail_in(text,bigint,bigint,text,interval,interval)',
		'pgjq.heartbeat_in(text,bigint,bigint,interval)',
		'pgjq.snooze_in(text,bigint,bigint,interval)',
		'pgjq.job_in(text,bigint)',
		'pgjq.route(text)'],
	'pgjq_worker can execute claim (both forms), await, complete (both forms), complete_and_claim, fail, hold_key, release_key, heartbeat, snooze, job, wait_jobs and the Citus mode''s complete_in, fail_in, heartbeat_in, snooze_in, job_in and route, nothing else');
SELECT set_eq(
	$$SELECT * FROM pg_temp.executable('pgjq_admin')$$,
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname !~ '^_'$$,
	'pgjq_admin can execute every public pgjq function and procedure');
-- Internal helpers: the producer and the worker may run only those that
-- queue_stats and await() call as them; every other one (the Citus mode's
-- _serve, _job_guard and _citus_* among them) runs inside definer functions.
SELECT set_eq(
	$$SELECT r::text || ' ' || p.oid::regprocedure::text
		FROM unnest(ARRAY['pgjq_producer', 'pgjq_worker']::name[]) r, pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname ~ '^_'
		 AND has_function_privilege(r, p.oid, 'EXECUTE')$$,
	ARRAY['pgjq_producer pgjq._limits()', 'pgjq_producer pgjq._preloaded()', 'pgjq_producer pgjq._ring_counts()',
		  'pgjq_worker pgjq._limits()', 'pgjq_worker pgjq._preloaded()', 'pgjq_worker pgjq._ring_counts()',
		  'pgjq_worker pgjq._await_ids(text[])', 'pgjq_worker pgjq._await_ready(integer[])'],
	'the producer and the worker can execute no internal helper but those queue_stats and await() need');
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

-- The Citus mode's queue-first forms: the roles of their plain forms (on a
-- single server they are the plain forms); route() to both, which says here
-- that this is no Citus cluster; citus_setup() and move_queues() are
-- granted to the admin only, and refuse a caller who is not a superuser
-- (review 0.4.0 M5); a superuser gets 55000 here for want of Citus.
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT pgjq.create_queue('privq_in')$$), 'ok',
	'an admin can create another queue');
SELECT is(pg_temp.run_as('pgjq_test_producer',
		$$CREATE TEMP TABLE ids_in AS SELECT pgjq.enqueue('privq_in', p) AS id
			FROM unnest(ARRAY['{"n":1}', '{"n":2}', '{"n":3}']::jsonb[]) p$$), 'ok',
	'a producer can enqueue three jobs');
SELECT is(pg_temp.run_as('pgjq_test_producer',
		$$SELECT * FROM pgjq.job_in('privq_in', (SELECT min(id) FROM ids_in))$$), 'ok',
	'a producer can call job_in');
SELECT is(pg_temp.run_as('pgjq_test_producer',
		$$SELECT pgjq.complete_in('privq_in', ARRAY[1::bigint], ARRAY[1::bigint])$$), '42501',
	'a producer cannot complete_in');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$CREATE TEMP TABLE leases_in AS SELECT id, token FROM pgjq.claim('privq_in', 3)$$), 'ok',
	'a worker claims them');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.heartbeat_in('privq_in', id, token) FROM leases_in$$), 'ok',
	'a worker can heartbeat_in');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT * FROM pgjq.job_in('privq_in', (SELECT min(id) FROM leases_in))$$), 'ok',
	'a worker can call job_in');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.snooze_in('privq_in', id, token, '1 hour') FROM (SELECT * FROM leases_in ORDER BY id LIMIT 1) l$$), 'ok',
	'a worker can snooze_in');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.fail_in('privq_in', id, token, 'boom') FROM (SELECT * FROM leases_in ORDER BY id OFFSET 1 LIMIT 1) l$$), 'ok',
	'a worker can fail_in');
SELECT is(pg_temp.run_as('pgjq_test_worker',
		$$SELECT pgjq.complete_in('privq_in', ARRAY(SELECT id FROM leases_in ORDER BY id OFFSET 2),
								  ARRAY(SELECT token FROM leases_in ORDER BY id OFFSET 2))$$), 'ok',
	'a worker can complete_in');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT pgjq.cancel_in('privq_in', ARRAY[1::bigint])$$), '42501',
	'a worker cannot cancel_in');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT pgjq.cancel_in('privq_in', ARRAY(SELECT id FROM ids_in))$$), 'ok',
	'a producer can cancel_in');
SELECT is(pg_temp.run_as('pgjq_test_producer', $$SELECT * FROM pgjq.route('privq_in')$$), '55000',
	'a producer may call route(), which on a single server raises 55000');
SELECT is(pg_temp.run_as('pgjq_test_nobody', $$SELECT * FROM pgjq.route('privq_in')$$), '42501',
	'a role without grants cannot call route()');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$SELECT * FROM pgjq.citus_setup()$$), '42501',
	'a worker cannot call citus_setup()');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$SELECT * FROM pgjq.citus_setup()$$), '42501',
	'an admin who is not a superuser is refused by citus_setup() (42501)');
SELECT is(pg_temp.run_as('pgjq_test_worker', $$CALL pgjq.move_queues(1, 'localhost', 5432)$$), '42501',
	'a worker cannot call move_queues()');
SELECT is(pg_temp.run_as('pgjq_test_admin', $$CALL pgjq.move_queues(1, 'localhost', 5432)$$), '42501',
	'an admin who is not a superuser is refused by move_queues() (42501)');
SELECT throws_ok($$CALL pgjq.move_queues(1, 'localhost', 5432)$$, '55000', NULL,
	'a superuser may call move_queues(), which without Citus raises 55000');
SELECT results_eq(
	$$SELECT completed, cancelled FROM pgjq.queue_stats WHERE queue = 'privq_in'$$,
	$$VALUES (1::bigint, 2::bigint)$$,
	'through the *_in forms: one job completed, the snoozed and the failed one cancelled');

SELECT * FROM finish();
ROLLBACK;
