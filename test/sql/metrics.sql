--
-- metrics: pgjq.metrics() and pgjq.metrics_prometheus() after a known
-- workload.  Counters live in shared memory for the server's life and other
-- files use other queues, so every check reads this file's queues only
-- (metrics(queue) or a filter on the queue label).  Times are never
-- printed: only counts and comparisons.
--
\set VERBOSITY terse

-- the shape, the security settings and who may call them
SELECT p.oid::regprocedure AS function, p.prosecdef, p.proconfig,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
  FROM pg_proc p
 WHERE p.oid IN ('pgjq.metrics(text)'::regprocedure, 'pgjq.metrics_prometheus(text)'::regprocedure)
 ORDER BY 1;
SELECT r.rolname,
       has_function_privilege(r.rolname, 'pgjq.metrics(text)', 'execute') AS metrics,
       has_function_privilege(r.rolname, 'pgjq.metrics_prometheus(text)', 'execute') AS prometheus
  FROM (VALUES ('pgjq_admin'), ('pg_monitor'), ('pgjq_producer'), ('pgjq_worker')) r(rolname)
 ORDER BY 1;
SELECT has_function_privilege('public', 'pgjq.metrics(text)', 'execute') AS public_may_call;

-- the workload's queues
SELECT pgjq.create_queue('m_a');
SELECT pgjq.create_queue('m_dead', max_attempts => 2);
SELECT pgjq.create_queue('m_conc', concurrency => 1);
SELECT pgjq.create_queue('m_key', key_concurrency => 1);
SELECT pgjq.create_queue('m_rate', rate => 0.001, burst => 1);
SELECT pgjq.create_queue('m_wait');

-- counters exist (preloaded) and start at zero for a new queue
SELECT name, labels, value FROM pgjq.metrics('m_a')
 WHERE name NOT LIKE 'pgjq_job_run_seconds%' AND name NOT LIKE 'pgjq_claim_wait_seconds%'
 ORDER BY name, labels::text;

-- 10 jobs; 4 claimed in one batch and completed together
SELECT count(pgjq.enqueue('m_a', jsonb_build_object('n', i))) FROM generate_series(1, 10) i;
SELECT array_agg(id) AS ids, array_agg(token) AS tokens FROM pgjq.claim('m_a', 4) \gset
SELECT pgjq.complete(:'ids'::bigint[], :'tokens'::bigint[]);
-- the same pair again: stale (once per pair)
SELECT pgjq.complete(:'ids'::bigint[], :'tokens'::bigint[]);

-- on its own queue, a job fails and is retried, then fails again and is dead
SELECT pgjq.enqueue('m_dead') IS NOT NULL AS enqueued;
SELECT id, token FROM pgjq.claim('m_dead') \gset
SELECT pgjq.fail(:id, :token, 'boom', retry_in => '0s');
SELECT pgjq.fail(:id, :token, 'stale now');
SELECT pgjq.promote() >= 0 AS promoted;
SELECT id = :id AS same_job, token AS token2 FROM pgjq.claim('m_dead') \gset
SELECT :'same_job' AS same_job;
SELECT pgjq.fail(:id, :token2, 'boom again');
SELECT name, value FROM pgjq.metrics('m_dead')
 WHERE name LIKE '%\_total' AND name <> 'pgjq_claims_held_back_total' AND value > 0
 ORDER BY name;
SELECT value AS dead FROM pgjq.metrics('m_dead') WHERE name = 'pgjq_jobs' AND labels->>'state' = 'dead';

-- a lease that expires is rescued (a retry here), with its run time
SELECT pgjq.enqueue('m_dead') IS NOT NULL AS enqueued;
SELECT count(*) FROM pgjq.claim('m_dead', lease => '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT max(value) FILTER (WHERE name = 'pgjq_jobs_rescued_total') AS rescued,
       max(value) FILTER (WHERE name = 'pgjq_job_run_seconds_count') AS run_times
  FROM pgjq.metrics('m_dead');

-- one snoozed, one heartbeat with a stale token
SELECT id, token FROM pgjq.claim('m_a') \gset
SELECT pgjq.snooze(:id, :token, '1 hour');
SELECT pgjq.heartbeat(:id, :token) IS NULL AS stale_heartbeat;
SELECT pgjq.snooze(:id, :token, '1 hour') AS stale_snooze;

-- one cancelled while ready, one cancelled while running (ends at its outcome)
SELECT pgjq.cancel(pgjq.enqueue('m_a'));
SELECT id, token FROM pgjq.claim('m_a') \gset
SELECT pgjq.cancel(:id);
SELECT pgjq.complete(:id, :token) AS completed_after_cancel;

-- a rolled-back transaction counts nothing
BEGIN;
SELECT count(pgjq.enqueue('m_a')) FROM generate_series(1, 5);
SELECT count(*) FROM pgjq.complete_and_claim('m_a', NULL, NULL, 3);
ROLLBACK;

-- a rolled-back savepoint's counts are dropped, the rest of the transaction stays
BEGIN;
SELECT pgjq.enqueue('m_a') IS NOT NULL AS enqueued;
SAVEPOINT s1;
SELECT count(pgjq.enqueue('m_a')) FROM generate_series(1, 7);
SELECT array_agg(id) AS sids, array_agg(token) AS stoks FROM pgjq.claim('m_a', 2) \gset
SELECT pgjq.complete(:'sids'::bigint[], :'stoks'::bigint[]);
ROLLBACK TO SAVEPOINT s1;
SAVEPOINT s2;
SELECT pgjq.enqueue('m_a') IS NOT NULL AS enqueued;
RELEASE SAVEPOINT s2;
COMMIT;

-- the counters of m_a: 13 enqueued (10 + 1 cancelled + 2 in the savepoint
-- transaction), 6 claimed, 4 completed, 1 snoozed, 2 cancelled, 6 stale (the
-- 4 pairs again, heartbeat and snooze with a snoozed job's token)
SELECT name, value FROM pgjq.metrics('m_a')
 WHERE name LIKE '%\_total' AND name <> 'pgjq_claims_held_back_total'
 ORDER BY name;
-- the gauges agree with the tables
SELECT labels->>'state' AS state, value FROM pgjq.metrics('m_a')
 WHERE name = 'pgjq_jobs' ORDER BY 1;
SELECT ready, scheduled, running, dead, cancelled FROM pgjq.queue_stats WHERE queue = 'm_a';
SELECT value > 0 AS oldest_ready_age_positive FROM pgjq.metrics('m_a')
 WHERE name = 'pgjq_oldest_ready_age_seconds';
SELECT value BETWEEN 3000 AND 3600 AS next_scheduled_in_an_hour FROM pgjq.metrics('m_a')
 WHERE name = 'pgjq_next_scheduled_seconds';
-- held keys: a hold still ahead counts, one that ended does not
SELECT pgjq.hold_key('m_a', 'k1', now() + interval '1 hour'), pgjq.hold_key('m_a', NULL, now() + interval '1 hour');
SELECT value AS held_keys FROM pgjq.metrics('m_a') WHERE name = 'pgjq_held_keys';
SELECT pgjq.release_key('m_a', 'k1'), pgjq.release_key('m_a', NULL);
SELECT value AS held_keys FROM pgjq.metrics('m_a') WHERE name = 'pgjq_held_keys';

-- run time: every outcome of a claimed job (4 completed, the snooze, the
-- cancelled one) was observed; buckets are cumulative and end in +Inf
SELECT value AS run_count FROM pgjq.metrics('m_a') WHERE name = 'pgjq_job_run_seconds_count';
SELECT bool_and(value >= prev) AS cumulative, max(value) FILTER (WHERE labels->>'le' = '+Inf') AS inf,
       count(*) AS buckets
  FROM (SELECT value, lag(value, 1, 0::float8) OVER (ORDER BY n) AS prev, labels
          FROM pgjq.metrics('m_a') WITH ORDINALITY AS m(name, labels, value, n)
         WHERE name = 'pgjq_job_run_seconds_bucket') b;
SELECT value >= 0 AS sum_ok FROM pgjq.metrics('m_a') WHERE name = 'pgjq_job_run_seconds_sum';

-- claims held back, by limit
SELECT pgjq.enqueue('m_conc') IS NOT NULL, pgjq.enqueue('m_conc') IS NOT NULL;
SELECT count(*) FROM pgjq.claim('m_conc');
SELECT count(*) FROM pgjq.claim('m_conc');
SELECT pgjq.pause('m_conc');
SELECT count(*) FROM pgjq.claim('m_conc');
SELECT pgjq.enqueue('m_key', fair_key => 'k') IS NOT NULL, pgjq.enqueue('m_key', fair_key => 'k') IS NOT NULL;
SELECT count(*) FROM pgjq.claim('m_key', 2);
SELECT count(pgjq.enqueue('m_rate')) FROM generate_series(1, 3);
SELECT count(*) FROM pgjq.claim('m_rate', 3);
SELECT labels->>'queue' AS queue, labels->>'limit' AS limit, value
  FROM pgjq.metrics() WHERE name = 'pgjq_claims_held_back_total' AND labels->>'queue' LIKE 'm\_%'
   AND value > 0
 ORDER BY 1, 2;

-- a claim that waited: counted with its time
SELECT count(*) FROM pgjq.claim('m_wait', wait => '50 milliseconds');
SELECT max(value) FILTER (WHERE name = 'pgjq_claim_wait_seconds_count') AS waits,
       max(value) FILTER (WHERE name = 'pgjq_claim_wait_seconds_sum') >= 0.04 AS waited_long_enough,
       max(value) FILTER (WHERE name = 'pgjq_claim_wait_seconds_bucket' AND labels->>'le' = '0.01') AS under_10ms,
       max(value) FILTER (WHERE name = 'pgjq_claim_wait_seconds_bucket' AND labels->>'le' = '+Inf') AS inf
  FROM pgjq.metrics('m_wait');

-- database-wide series come without a filter only
SELECT DISTINCT name FROM pgjq.metrics()
 WHERE name IN ('pgjq_counters_available', 'pgjq_metrics_overflow_total', 'pgjq_horizon_age_xacts')
 ORDER BY 1;
SELECT value FROM pgjq.metrics() WHERE name IN ('pgjq_counters_available', 'pgjq_metrics_overflow_total')
 ORDER BY name;
SELECT DISTINCT name FROM pgjq.metrics('m_a') WHERE labels = '{}' ORDER BY 1;

-- the Prometheus text: one HELP and TYPE per family, before its samples
SELECT line FROM regexp_split_to_table(pgjq.metrics_prometheus('m_conc'), E'\n') AS line
 WHERE line LIKE '# TYPE%' OR line LIKE 'pgjq\_jobs\_%total%' OR line LIKE 'pgjq\_claims%'
    OR line LIKE 'pgjq\_jobs{%';
SELECT right(pgjq.metrics_prometheus('m_conc'), 1) = E'\n' AS ends_in_newline;

-- label values are escaped: a queue whose name has a quote, a backslash and
-- a newline (create_queue refuses such names; the table does not)
INSERT INTO pgjq.queue (name, lease, max_attempts, backoff_base, backoff_max, retention)
VALUES (E'we"ird\\q\nx', '30s', 1, '1s', '1h', '1d');
SELECT line FROM regexp_split_to_table(pgjq.metrics_prometheus(), E'\n') AS line
 WHERE line LIKE '%we%ird%' AND (line LIKE 'pgjq\_jobs{%' OR line LIKE 'pgjq\_jobs\_enqueued%');
SELECT labels FROM pgjq.metrics() WHERE name = 'pgjq_jobs' AND labels->>'queue' LIKE 'we%' LIMIT 1;
DELETE FROM pgjq.queue WHERE name = E'we"ird\\q\nx';

-- pg_monitor may read them (and nothing else of pgjq)
CREATE ROLE m_monitor IN ROLE pg_monitor;
SET ROLE m_monitor;
SELECT count(*) > 0 AS rows FROM pgjq.metrics();
SELECT length(pgjq.metrics_prometheus()) > 0 AS text;
SELECT count(*) FROM pgjq.job;
\echo :SQLSTATE
RESET ROLE;
DROP ROLE m_monitor;

-- bad input
SELECT * FROM pgjq.metrics('m_nope');
\echo :SQLSTATE
SELECT pgjq.metrics_prometheus('m_nope');
\echo :SQLSTATE
SELECT * FROM pgjq.metrics('');
\echo :SQLSTATE
SELECT pgjq.metrics_prometheus('no spaces');
\echo :SQLSTATE
SELECT * FROM pgjq.metrics(repeat('x', 200));
\echo :SQLSTATE

-- drop_queue forgets the counters; a new queue of that name starts at zero
SELECT pgjq.drop_queue('m_a', force => true);
SELECT pgjq.create_queue('m_a');
SELECT name, value FROM pgjq.metrics('m_a') WHERE name = 'pgjq_jobs_enqueued_total';
SELECT pgjq.drop_queue('m_a');
SELECT pgjq.drop_queue(q, force => true) FROM unnest(ARRAY['m_conc', 'm_dead', 'm_key', 'm_rate', 'm_wait']) q;
