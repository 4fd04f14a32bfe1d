-- The schema objects of the public API: functions with their argument
-- names, types and results, tables, sequences, the view and the types.
-- Every function is SECURITY DEFINER with search_path pinned to
-- pg_catalog, pg_temp, but await() and the Citus mode's functions that run
-- as their caller (listed below).  Run by test/run with pg_prove; the database already
-- has the pgtap and pgjq extensions.

\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off

BEGIN;
SELECT plan(47);

SELECT has_extension('pgjq', 'pgjq', 'extension pgjq lives in schema pgjq');
SELECT has_schema('pgjq');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'pgjq'), false,
	'pgjq is not relocatable');

-- ---------------------------------------------------------------- functions

-- The whole public API (functions and procedures not starting with "_"):
-- each signature with argument names, modes and types, and its result.
-- Internal helpers (pgjq._name) may come and go; the privilege tests and the
-- checks below cover them too.
SELECT set_eq(
	$$SELECT CASE p.prokind WHEN 'p' THEN 'procedure ' ELSE '' END
			 || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
			 || coalesce(' -> ' || pg_get_function_result(p.oid), '')
		FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname !~ '^_'$$,
	$$VALUES
		('create_queue(queue text, lease interval, max_attempts integer, backoff_base interval, backoff_max interval, retention interval, concurrency integer, key_concurrency integer, rate double precision, burst integer, timeout interval, key_rate double precision, key_burst integer) -> void'),
		('alter_queue(queue text, lease interval, max_attempts integer, backoff_base interval, backoff_max interval, retention interval, concurrency integer, key_concurrency integer, rate double precision, burst integer, timeout interval, key_rate double precision, key_burst integer) -> void'),
		('drop_queue(queue text, force boolean) -> void'),
		('pause(queue text) -> void'),
		('resume(queue text) -> void'),
		('purge(queue text) -> bigint'),
		('list_queues(OUT queue text, OUT lease interval, OUT max_attempts integer, OUT backoff_base interval, OUT backoff_max interval, OUT retention interval, OUT concurrency integer, OUT key_concurrency integer, OUT rate double precision, OUT burst integer, OUT paused boolean, OUT created_at timestamp with time zone, OUT timeout interval, OUT key_rate double precision, OUT key_burst integer) -> SETOF record'),
		('enqueue(queue text, payload jsonb, delay interval, run_at timestamp with time zone, priority integer, fair_key text, dedup_key text, max_attempts integer, timeout interval, dedup_scope text, dedup_for interval, on_duplicate text, debounce_max interval, after bigint[], on_dependency_failure text) -> bigint'),
		('enqueue_many(queue text, payloads jsonb[], delay interval, run_at timestamp with time zone, priority integer, fair_keys text[], dedup_keys text[], timeout interval, dedup_scope text, dedup_for interval, on_duplicate text, debounce_max interval, after jsonb[], on_dependency_failure text) -> SETOF bigint'),
		('claim(queue text, batch integer, lease interval, worker text, wait interval) -> SETOF pgjq.claimed'),
		('claim(queues text[], batch integer, lease interval, worker text, wait interval) -> SETOF pgjq.claimed'),
		('procedure await(IN queues text[], IN wait interval)'),
		('complete(id bigint, token bigint, result jsonb) -> boolean'),
		('complete(ids bigint[], tokens bigint[], results jsonb[]) -> bigint'),
		('complete_and_claim(queue text, ids bigint[], tokens bigint[], batch integer, lease interval, worker text, errors text[], results jsonb[]) -> SETOF pgjq.claimed'),
		('fail(id bigint, token bigint, error text, retry_in interval, hold_key_for interval) -> text'),
		('hold_key(queue text, fair_key text, until timestamp with time zone) -> void'),
		('release_key(queue text, fair_key text) -> boolean'),
		('heartbeat(id bigint, token bigint, extend interval) -> timestamp with time zone'),
		('snooze(id bigint, token bigint, delay interval) -> boolean'),
		('cancel(id bigint) -> boolean'),
		('cancel_many(ids bigint[]) -> bigint'),
		('cancel_key(queue text, fair_key text) -> bigint'),
		('retry_dead(queue text, ids bigint[]) -> bigint'),
		('promote() -> bigint'),
		('rescue() -> bigint'),
		('prune() -> bigint'),
		('maintain(OUT promoted bigint, OUT rescued bigint, OUT pruned bigint) -> record'),
		('job(id bigint) -> SETOF pgjq.job_info'),
		('schedule(name text, cron text, queue text, payload jsonb, time_zone text, catch_up text) -> timestamp with time zone'),
		('unschedule(name text) -> boolean'),
		('list_schedules(OUT name text, OUT cron text, OUT queue text, OUT payload jsonb, OUT time_zone text, OUT catch_up text, OUT next_slot timestamp with time zone, OUT last_slot timestamp with time zone, OUT created_at timestamp with time zone) -> SETOF record'),
		('wait_jobs(ids bigint[], wait interval, "all" boolean) -> TABLE(id bigint, state text, attempt integer, result jsonb)'),
		('health(OUT horizon_holder text, OUT horizon_xid xid, OUT horizon_age_xacts bigint, OUT horizon_age_seconds double precision, OUT horizon_held_since timestamp with time zone, OUT pid integer, OUT backend_type text, OUT usename text, OUT application_name text, OUT state text, OUT xact_start timestamp with time zone, OUT query_start timestamp with time zone, OUT slot_name text, OUT gid text, OUT ring_refused bigint, OUT ring_refused_at timestamp with time zone, OUT ring_refused_bound text) -> record'),
		('verify(OUT area text, OUT object text, OUT expected text, OUT found text) -> SETOF record'),
		('metrics(queue text, OUT name text, OUT labels jsonb, OUT value double precision) -> SETOF record'),
		('metrics_prometheus(queue text) -> text'),
		-- Citus mode (README, "Beyond one server (Citus)")
		('route(queue text, OUT node_name text, OUT node_port integer, OUT group_id integer, OUT shard bigint) -> record'),
		('complete_in(queue text, ids bigint[], tokens bigint[], results jsonb[]) -> bigint'),
		('fail_in(queue text, id bigint, token bigint, error text, retry_in interval, hold_key_for interval) -> text'),
		('heartbeat_in(queue text, id bigint, token bigint, extend interval) -> timestamp with time zone'),
		('snooze_in(queue text, id bigint, token bigint, delay interval) -> boolean'),
		('cancel_in(queue text, ids bigint[]) -> bigint'),
		('job_in(queue text, id bigint) -> SETOF pgjq.job_info'),
		('citus_setup(shard_count integer) -> TABLE(node_name text, node_port integer, group_id integer, result text)'),
		('routing_shard_allowed_on_node(shardid bigint, nodeid integer) -> boolean'),
		('procedure move_queues(IN shard bigint, IN node_name text, IN node_port integer, IN drain_wait interval)')$$,
	'the public functions have the documented names, argument names, types and results');

-- Named arguments are part of the contract: one call per function with every
-- argument named must resolve (only resolution is checked, nothing runs).
SELECT lives_ok($$PREPARE named_args AS
	SELECT pgjq.create_queue(queue => 'x', lease => '1 s', max_attempts => 1, backoff_base => '1 s', backoff_max => '1 s',
							 retention => '1 s', concurrency => 1, key_concurrency => 1, rate => 1.5, burst => 1,
							 timeout => '1 s', key_rate => 1.5, key_burst => 1),
		   pgjq.alter_queue(queue => 'x', lease => '1 s', max_attempts => 1, backoff_base => '1 s', backoff_max => '1 s',
							retention => '1 s', concurrency => 1, key_concurrency => 1, rate => 1.5, burst => 1,
							timeout => '1 s', key_rate => 1.5, key_burst => 1),
		   pgjq.drop_queue(queue => 'x', force => true),
		   pgjq.pause(queue => 'x'), pgjq.resume(queue => 'x'), pgjq.purge(queue => 'x'),
		   pgjq.enqueue(queue => 'x', payload => '{}', delay => '1 s', run_at => now(), priority => 1,
						fair_key => 'f', dedup_key => 'd', max_attempts => 1, timeout => '1 s',
						dedup_scope => 'waiting', dedup_for => NULL, on_duplicate => 'replace', debounce_max => '1 s',
						after => NULL, on_dependency_failure => 'run'),
		   pgjq.enqueue_many(queue => 'x', payloads => ARRAY['{}'::jsonb], delay => '1 s', run_at => now(),
							 priority => 1, fair_keys => ARRAY['f'], dedup_keys => ARRAY['d'], timeout => '1 s',
							 dedup_scope => 'waiting', dedup_for => NULL, on_duplicate => 'replace',
							 debounce_max => '1 s', after => NULL, on_dependency_failure => 'run'),
		   pgjq.claim(queue => 'x', batch => 1, lease => '1 s', worker => 'w', wait => '1 s'),
		   pgjq.claim(queues => ARRAY['x'], batch => 1, lease => '1 s', worker => 'w', wait => '1 s'),
		   pgjq.complete(id => 1, token => 1), pgjq.complete(ids => ARRAY[1::bigint], tokens => ARRAY[1::bigint]),
		   pgjq.complete_and_claim(queue => 'x', ids => ARRAY[1::bigint], tokens => ARRAY[1::bigint], batch => 1,
								   lease => '1 s', worker => 'w', errors => ARRAY['e']),
		   pgjq.fail(id => 1, token => 1, error => 'e', retry_in => '1 s', hold_key_for => '1 s'),
		   pgjq.hold_key(queue => 'x', fair_key => 'k', until => now()), pgjq.release_key(queue => 'x', fair_key => 'k'),
		   pgjq.heartbeat(id => 1, token => 1, extend => '1 s'),
		   pgjq.snooze(id => 1, token => 1, delay => '1 s'),
		   pgjq.cancel(id => 1), pgjq.retry_dead(queue => 'x', ids => ARRAY[1::bigint]),
		   pgjq.promote(), pgjq.rescue(), pgjq.prune(), pgjq.maintain(), pgjq.job(id => 1),
		   (SELECT count(*) FROM pgjq.wait_jobs(ids => ARRAY[1::bigint], wait => '1 s', "all" => false)),
		   pgjq.schedule(name => 's', cron => '* * * * *', queue => 'x', payload => '{}', time_zone => 'UTC',
						 catch_up => 'one'),
		   pgjq.unschedule(name => 's'),
		   (SELECT count(*) FROM pgjq.list_queues()), (SELECT count(*) FROM pgjq.metrics(queue => 'x')),
		   pgjq.metrics_prometheus(queue => 'x'),
		   (SELECT count(*) FROM pgjq.route(queue => 'x')),
		   pgjq.complete_in(queue => 'x', ids => ARRAY[1::bigint], tokens => ARRAY[1::bigint], results => NULL),
		   pgjq.fail_in(queue => 'x', id => 1, token => 1, error => 'e', retry_in => '1 s', hold_key_for => '1 s'),
		   pgjq.heartbeat_in(queue => 'x', id => 1, token => 1, extend => '1 s'),
		   pgjq.snooze_in(queue => 'x', id => 1, token => 1, delay => '1 s'),
		   pgjq.cancel_in(queue => 'x', ids => ARRAY[1::bigint]),
		   (SELECT count(*) FROM pgjq.job_in(queue => 'x', id => 1)),
		   (SELECT count(*) FROM pgjq.citus_setup(shard_count => 1))$$,
	'every function can be called with named arguments');
DEALLOCATE named_args;

-- Optional arguments may be left out, and plain literals resolve (a driver
-- sending an integer priority or an untyped queue name must not need casts).
SELECT lives_ok($$PREPARE short_args AS
	SELECT pgjq.create_queue('x'), pgjq.alter_queue('x'), pgjq.drop_queue('x'),
		   pgjq.enqueue('x'), pgjq.enqueue('x', '{}', priority => 5),
		   pgjq.enqueue_many('x', ARRAY['{}'::jsonb]), pgjq.claim('x'), pgjq.claim(ARRAY['x', 'y']),
		   pgjq.fail(1, 1), pgjq.heartbeat(1, 1), pgjq.retry_dead('x'),
		   (SELECT count(*) FROM pgjq.wait_jobs(ARRAY[1::bigint], '1 s')),
		   (SELECT count(*) FROM pgjq.metrics()), pgjq.metrics_prometheus(),
		   pgjq.complete_in('x', ARRAY[1::bigint], ARRAY[1::bigint]), pgjq.fail_in('x', 1, 1),
		   pgjq.heartbeat_in('x', 1, 1), pgjq.cancel_in('x', ARRAY[1::bigint]),
		   (SELECT count(*) FROM pgjq.citus_setup())$$,
	'optional arguments can be left out');
DEALLOCATE short_args;

-- Every function in the schema, helpers included, except the procedure
-- await(): PostgreSQL allows transaction control (which await needs to sleep
-- without a snapshot) only in a procedure without SECURITY DEFINER or SET.
-- It runs no SQL of its own but two schema-qualified definer helpers.
-- The Citus mode's setup, its rebalance strategy's function and its moves
-- run as their caller (they drive Citus's own functions and reach the other
-- nodes as the caller), with search_path pinned all the same.
SELECT set_eq(
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND NOT p.prosecdef$$,
	ARRAY['pgjq.await(text[],interval)',
		  'pgjq.citus_setup(integer)', 'pgjq._citus_node_setup()',
		  'pgjq.routing_shard_allowed_on_node(bigint,integer)',
		  'pgjq.move_queues(bigint,text,integer,interval)', 'pgjq._citus_on(text,integer,text)',
		  'pgjq._citus_finish_on(bigint,text,integer,text,integer)'],
	'every pgjq function is SECURITY DEFINER but await() and the Citus mode''s setup, strategy and moves');
-- move_queues() commits between its steps, which a procedure with a SET
-- clause cannot: it may set its search_path in each of its transactions
-- instead.
SELECT is_empty(
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace
		 AND p.oid NOT IN ('pgjq.await(text[],interval)'::regprocedure,
						   'pgjq.move_queues(bigint,text,integer,interval)'::regprocedure)
		 AND (p.proconfig IS NULL
			  OR NOT 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig))$$,
	'every pgjq function but await() and move_queues() pins search_path to pg_catalog, pg_temp');
SELECT is((SELECT p.prosecdef OR p.proconfig IS NOT NULL FROM pg_proc p
			WHERE p.oid = 'pgjq.await(text[],interval)'::regprocedure), false,
	'await() is SECURITY INVOKER without SET, so it may commit before sleeping');
SELECT is_empty(
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.prokind NOT IN ('f', 'p')$$,
	'pgjq has no aggregates or window functions');
SELECT is_empty(
	$$SELECT p.oid::regprocedure::text FROM pg_proc p
	   WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname !~ '^_'
		 AND obj_description(p.oid, 'pg_proc') IS NULL$$,
	'every public function has a comment');

-- A few spot checks through pgTAP's own functions.
SELECT function_returns('pgjq', 'claim', ARRAY['text', 'integer', 'interval', 'text', 'interval'], 'setof pgjq.claimed');
SELECT function_returns('pgjq', 'claim', ARRAY['text[]', 'integer', 'interval', 'text', 'interval'], 'setof pgjq.claimed');
SELECT function_returns('pgjq', 'enqueue',
	ARRAY['text', 'jsonb', 'interval', 'timestamp with time zone', 'integer', 'text', 'text', 'integer', 'interval', 'text', 'interval', 'text', 'interval', 'bigint[]', 'text'], 'bigint');
SELECT function_returns('pgjq', 'complete', ARRAY['bigint', 'bigint', 'jsonb'], 'boolean');
SELECT function_returns('pgjq', 'complete', ARRAY['bigint[]', 'bigint[]', 'jsonb[]'], 'bigint');
SELECT function_returns('pgjq', 'fail', ARRAY['bigint', 'bigint', 'text', 'interval', 'interval'], 'text');
SELECT function_returns('pgjq', 'heartbeat', ARRAY['bigint', 'bigint', 'interval'], 'timestamp with time zone');
SELECT is_definer('pgjq', 'claim', ARRAY['text', 'integer', 'interval', 'text', 'interval']);
SELECT is_definer('pgjq', 'enqueue',
	ARRAY['text', 'jsonb', 'interval', 'timestamp with time zone', 'integer', 'text', 'text', 'integer', 'interval', 'text', 'interval', 'text', 'interval', 'bigint[]', 'text']);
SELECT volatility_is('pgjq', 'claim', ARRAY['text', 'integer', 'interval', 'text', 'interval'], 'volatile');
SELECT volatility_is('pgjq', 'enqueue',
	ARRAY['text', 'jsonb', 'interval', 'timestamp with time zone', 'integer', 'text', 'text', 'integer', 'interval', 'text', 'interval', 'text', 'interval', 'bigint[]', 'text'], 'volatile');

-- ------------------------------------------------------------------- tables

SELECT has_table('pgjq', 'queue', 'table pgjq.queue exists');
SELECT has_table('pgjq', 'job', 'table pgjq.job exists');
SELECT has_table('pgjq', 'job_history', 'table pgjq.job_history exists');
SELECT has_table('pgjq', 'queue_fence', 'table pgjq.queue_fence exists (Citus mode; empty on a single server)');
SELECT has_sequence('pgjq', 'job_id_seq', 'sequence pgjq.job_id_seq exists');
SELECT has_sequence('pgjq', 'token_seq', 'sequence pgjq.token_seq exists');

-- Tables, sequences and the history partitions belong to the extension, so
-- pg_dump and DROP EXTENSION treat them as such.
SELECT is_empty(
	$$SELECT c.oid::regclass::text FROM pg_class c
	   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
		 AND NOT c.relispartition
		 AND NOT EXISTS (SELECT 1 FROM pg_depend d
						  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
							AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')$$,
	'every table, view and sequence in pgjq is a member of the extension');
SELECT set_has(
	$$SELECT unnest(extconfig)::regclass::text FROM pg_extension WHERE extname = 'pgjq'$$,
	$$VALUES ('pgjq.queue'), ('pgjq.job'), ('pgjq.job_id_seq'), ('pgjq.token_seq')$$,
	'the queue and job tables and the sequences are dumped by pg_dump');

-- --------------------------------------------------------------------- view

SELECT has_view('pgjq', 'queue_stats', 'view pgjq.queue_stats exists');
SELECT set_has(
	$$SELECT column_name::text FROM information_schema.columns
	   WHERE table_schema = 'pgjq' AND table_name = 'queue_stats'$$,
	$$VALUES ('queue'), ('paused'), ('ready'), ('scheduled'), ('running'), ('dead'), ('completed'),
			 ('cancelled'), ('oldest_ready_age'), ('next_run_at')$$,
	'queue_stats has the documented columns');
SELECT col_type_is('pgjq', 'queue_stats', 'queue', 'text', 'queue_stats.queue is text');
SELECT col_type_is('pgjq', 'queue_stats', 'ready', 'bigint', 'queue_stats.ready is bigint');
SELECT col_type_is('pgjq', 'queue_stats', 'oldest_ready_age', 'interval', 'queue_stats.oldest_ready_age is an interval');
SELECT ok((SELECT 'security_barrier=true' = ANY (reloptions) FROM pg_class
			WHERE oid = 'pgjq.queue_stats'::regclass),
	'queue_stats is a security_barrier view');

-- -------------------------------------------------------------------- types

SELECT has_composite('pgjq', 'claimed', 'type pgjq.claimed exists');
SELECT results_eq(
	$$SELECT a.attname::text COLLATE "default", format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a
	   WHERE a.attrelid = 'pgjq.claimed'::regclass AND a.attnum > 0 AND NOT a.attisdropped
	   ORDER BY a.attnum$$,
	$$VALUES ('id', 'bigint'), ('token', 'bigint'), ('attempt', 'integer'), ('payload', 'jsonb'),
			 ('fair_key', 'text'), ('priority', 'smallint'), ('enqueued_at', 'timestamp with time zone'),
			 ('lease_until', 'timestamp with time zone')$$,
	'pgjq.claimed has the documented columns, in order');
SELECT has_composite('pgjq', 'job_info', 'type pgjq.job_info exists');
SELECT results_eq(
	$$SELECT a.attname::text COLLATE "default", format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a
	   WHERE a.attrelid = 'pgjq.job_info'::regclass AND a.attnum > 0 AND NOT a.attisdropped
	   ORDER BY a.attnum$$,
	$$VALUES ('id', 'bigint'), ('queue', 'text'), ('state', 'text'), ('attempt', 'integer'),
			 ('max_attempts', 'integer'), ('priority', 'smallint'), ('fair_key', 'text'),
			 ('dedup_key', 'text'), ('payload', 'jsonb'), ('enqueued_at', 'timestamp with time zone'),
			 ('run_at', 'timestamp with time zone'), ('lease_until', 'timestamp with time zone'),
			 ('finished_at', 'timestamp with time zone'), ('worker', 'text'), ('last_error', 'text'),
			 ('cancel_requested', 'boolean'), ('result', 'jsonb'), ('waiting_for', 'bigint[]')$$,
	'pgjq.job_info has the documented columns, in order');

-- -------------------------------------------------------------------- roles

SELECT has_role('pgjq_producer');
SELECT has_role('pgjq_worker');
SELECT has_role('pgjq_admin');
SELECT is_empty(
	$$SELECT rolname::text FROM pg_roles
	   WHERE rolname IN ('pgjq_producer', 'pgjq_worker', 'pgjq_admin')
		 AND (rolcanlogin OR rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication)$$,
	'the pgjq roles are NOLOGIN and carry no special attributes');
SELECT is_empty(
	$$SELECT r.rolname::text || ' in ' || g.rolname::text
		FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member JOIN pg_roles g ON g.oid = m.roleid
	   WHERE r.rolname IN ('pgjq_producer', 'pgjq_worker', 'pgjq_admin')$$,
	'the pgjq roles are members of no other role');

-- --------------------------------------------------------------------- misc

SELECT ok(current_setting('shared_preload_libraries') ~ 'pgjq', 'pgjq is preloaded in the test cluster');
SELECT is(current_setting('pgjq.database_names'), '', 'the background worker serves no database here');

SELECT * FROM finish();
ROLLBACK;
