--
-- 00_setup: create the extension and check its public objects.
--
-- Every later file relies on this one (pg_regress runs them in name order in
-- one database).  Conventions of the suite:
--   * ids, tokens and times are never printed: they are captured with \gset
--     and compared;
--   * expected errors run under \set VERBOSITY terse, and \echo :SQLSTATE
--     after them shows the error code;
--   * each file uses its own queues and drops them at the end, so global
--     maintenance counts (promote(), rescue()) in later files stay exact.
--
CREATE EXTENSION pgjq;

-- the extension lives in schema pgjq and is not relocatable
SELECT e.extname, n.nspname, e.extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pgjq';

-- the three NOLOGIN roles that carry the privileges
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'pgjq\_%' ORDER BY 1;

-- the public API: names, argument names and result types are the contract
-- (defaults are ours to tune, so only the identity is shown; internal
-- helpers are named _*)
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result
  FROM pg_proc p
 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname NOT LIKE '\_%'
 ORDER BY p.proname, 2;

-- every API function is SECURITY DEFINER with a fixed search_path, but the
-- procedure await (transaction control needs SECURITY INVOKER without SET)
-- and the Citus mode's citus_setup, move_queues and
-- routing_shard_allowed_on_node, which run as their caller (they drive
-- Citus's own functions) with a fixed search_path
SELECT p.proname, p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname NOT LIKE '\_%'
   AND (NOT p.prosecdef OR p.proconfig IS DISTINCT FROM '{"search_path=pg_catalog, pg_temp"}');
-- and so is any internal helper that is SECURITY DEFINER (the Citus mode's
-- _citus_adopt_queues and _citus_release_queues also turn the guard off)
SELECT p.proname, p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.prosecdef
   AND p.proconfig IS DISTINCT FROM '{"search_path=pg_catalog, pg_temp"}';

-- nothing in the schema is executable or readable by PUBLIC
SELECT count(*) AS public_functions
  FROM pg_proc p
 WHERE p.pronamespace = 'pgjq'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE');

SELECT c.relname AS public_readable
  FROM pg_class c
 WHERE c.relnamespace = 'pgjq'::regnamespace
   AND has_table_privilege('public', c.oid, 'SELECT');

-- the composite types returned by claim() and job()
SELECT t.typname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
 WHERE t.typnamespace = 'pgjq'::regnamespace AND t.typname IN ('claimed', 'job_info')
   AND a.attnum > 0
 ORDER BY t.typname, a.attnum;

-- queue_stats columns
SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a
 WHERE a.attrelid = 'pgjq.queue_stats'::regclass AND a.attnum > 0
 ORDER BY a.attnum;

-- every public object has a comment
SELECT p.proname AS missing_comment
  FROM pg_proc p
 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.proname NOT LIKE '\_%'
   AND obj_description(p.oid, 'pg_proc') IS NULL;
SELECT obj_description('pgjq.queue_stats'::regclass, 'pg_class') IS NOT NULL AS view_commented;

-- a fresh database has no queues
SELECT * FROM pgjq.list_queues();
SELECT * FROM pgjq.queue_stats;

-- Helpers for the other files (schema regress, not part of pgjq).
CREATE SCHEMA regress;
GRANT USAGE ON SCHEMA regress TO PUBLIC;

-- One queue's job counts per state, as one line.
CREATE FUNCTION regress.counts(q text) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT format('ready %s scheduled %s running %s dead %s completed %s cancelled %s',
				  s.ready, s.scheduled, s.running, s.dead, s.completed, s.cancelled)
	  FROM pgjq.queue_stats s WHERE s.queue = q
$$;
