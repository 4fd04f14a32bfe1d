--
-- health: pgjq.health() reports who holds back the xmin horizon (the oldest
-- transaction vacuum must keep rows for) and for how long.  Only what is
-- deterministic on a quiet test server is printed: the row's shape, the
-- privileges, the setting, and that nothing holds the horizon for long.
-- test/t/080_horizon.pl pins the horizon and checks the holders and the
-- background worker's warning.
--
\set VERBOSITY terse

-- the columns: numbers an alert query can compare, and who holds it
SELECT a.n, a.name, format_type(a.type, NULL) AS type
  FROM pg_proc p, unnest(p.proargnames, p.proallargtypes) WITH ORDINALITY a(name, type, n)
 WHERE p.oid = 'pgjq.health()'::regprocedure
 ORDER BY a.n;
SELECT p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
  FROM pg_proc p WHERE p.oid = 'pgjq.health()'::regprocedure;

-- always exactly one row
SELECT count(*) FROM pgjq.health();

-- a healthy server: nothing has held the horizon for pgjq.horizon_warn_after
-- (a holder's age in time is NULL only for a replication slot: none here)
SHOW pgjq.horizon_warn_after;
SELECT horizon_age_xacts >= 0 AS xacts_counted,
       horizon_age_seconds IS NOT NULL AS seconds_known,
       horizon_age_seconds < 300 AS not_held_long,
       slot_name IS NULL AND gid IS NULL AS no_slot_no_prepared
  FROM pgjq.health();
-- with no holder the ages are 0, with one they are its ages
SELECT CASE WHEN horizon_holder IS NULL
            THEN horizon_age_xacts = 0 AND horizon_age_seconds = 0 AND horizon_xid IS NULL
            ELSE horizon_holder = 'backend' AND horizon_xid IS NOT NULL AND pid IS NOT NULL
       END AS consistent
  FROM pgjq.health();

-- the caller's own snapshot and transaction id are never reported: asking
-- from inside a long transaction does not name the asker
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT txid_current() > 0 AS has_xid;
SELECT pid IS DISTINCT FROM pg_backend_pid() AS not_the_caller FROM pgjq.health();
COMMIT;

-- privileges: pgjq_admin may call it, pgjq_worker, pgjq_producer and others
-- may not
CREATE ROLE regress_health_admin IN ROLE pgjq_admin;
CREATE ROLE regress_health_worker IN ROLE pgjq_worker;
CREATE ROLE regress_health_producer IN ROLE pgjq_producer;
CREATE ROLE regress_health_none;
SET ROLE regress_health_admin;
SELECT count(*) AS admin_rows FROM pgjq.health();
RESET ROLE;
SET ROLE regress_health_worker;
SELECT count(*) FROM pgjq.health();
\echo :SQLSTATE
RESET ROLE;
SET ROLE regress_health_producer;
SELECT count(*) FROM pgjq.health();
\echo :SQLSTATE
RESET ROLE;
SET ROLE regress_health_none;
SELECT count(*) FROM pgjq.health();
\echo :SQLSTATE
RESET ROLE;
DROP ROLE regress_health_admin, regress_health_worker, regress_health_producer, regress_health_none;
