--
-- wait_jobs: one row per listed id with its state, attempt and result; it
-- returns at once when the jobs have finished (all of them, or with
-- all => false the first one), else when the wait ends, with what is known
-- then.  Bad arguments are refused with their name.  Wake-ups by another
-- session's commit: test/specs/wait_jobs_wake.spec.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qw', backoff_base => '1 hour', max_attempts => 1);
SELECT count(*) FROM pgjq.enqueue_many('qw', array_fill('{}'::jsonb, ARRAY[4]));
CREATE TEMP TABLE w AS SELECT id, token, row_number() OVER (ORDER BY id) AS n FROM pgjq.claim('qw', 4);
SELECT pgjq.enqueue('qw', '{"later": true}', delay => '1 hour') AS sched \gset

-- finished jobs return at once: completed (with its result), dead, cancelled
SELECT pgjq.complete(id, token, '{"answer": 42}') FROM w WHERE n = 1;
SELECT pgjq.fail(id, token, 'no more attempts') FROM w WHERE n = 2;
SELECT pgjq.cancel(:sched);
SELECT w.n, r.state, r.attempt, r.result
  FROM pgjq.wait_jobs((SELECT array_agg(id ORDER BY n) FROM w WHERE n <= 2) || :sched::bigint,
                      '10 s') r
  LEFT JOIN w ON w.id = r.id ORDER BY w.n NULLS LAST;

-- rows come in the order given, duplicates too
SELECT w.n, r.state FROM pgjq.wait_jobs(ARRAY[(SELECT id FROM w WHERE n = 2),
                                              (SELECT id FROM w WHERE n = 1),
                                              (SELECT id FROM w WHERE n = 2)], '0') r
  JOIN w ON w.id = r.id;

-- all => false: the first finished job is enough
SELECT w.n, r.state FROM pgjq.wait_jobs((SELECT array_agg(id ORDER BY n) FROM w WHERE n IN (1, 3)),
                                        '10 s', "all" => false) r
  JOIN w ON w.id = r.id ORDER BY w.n;

-- a running job does not finish: the wait ends with what is known then
SELECT w.n, r.state, r.attempt, r.result,
       clock_timestamp() - statement_timestamp() >= interval '100 ms' AS waited
  FROM pgjq.wait_jobs((SELECT array_agg(id ORDER BY n) FROM w WHERE n IN (1, 3)), '150 ms') r
  JOIN w ON w.id = r.id ORDER BY w.n;

-- query cancel and statement_timeout interrupt a wait
SET statement_timeout = '200ms';
SELECT * FROM pgjq.wait_jobs((SELECT array_agg(id) FROM w WHERE n = 3), '10 s');
RESET statement_timeout;

-- wait => '0' looks once
SELECT w.n, r.state FROM pgjq.wait_jobs((SELECT array_agg(id) FROM w WHERE n = 4), '0') r
  JOIN w ON w.id = r.id;

-- an id with no job (never enqueued, or pruned) counts as finished: state NULL
SELECT id, state, attempt, result FROM pgjq.wait_jobs(ARRAY[-1]::bigint[], '10 s');

-- an empty list: no rows, no wait
SELECT count(*) FROM pgjq.wait_jobs('{}', '10 s');

-- bad arguments, each named
SELECT * FROM pgjq.wait_jobs(NULL, '1 s');
SELECT * FROM pgjq.wait_jobs(ARRAY[1, NULL]::bigint[], '1 s');
SELECT * FROM pgjq.wait_jobs(ARRAY[[1, 2], [3, 4]]::bigint[], '1 s');
SELECT * FROM pgjq.wait_jobs(array_fill(1::bigint, ARRAY[10001]), '1 s');
SELECT * FROM pgjq.wait_jobs(ARRAY[1]::bigint[], NULL);
SELECT * FROM pgjq.wait_jobs(ARRAY[1]::bigint[], '-1 s');

-- under REPEATABLE READ a wait could never see a job finish: refused; a look is fine
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pgjq.wait_jobs(ARRAY[1]::bigint[], '1 s');
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT id, state FROM pgjq.wait_jobs(ARRAY[-1]::bigint[], '0');
ROLLBACK;

-- a transaction that finished a job cannot be prepared (its commit wakes
-- wait_jobs callers): here the cancel of a scheduled job
SELECT pgjq.enqueue('qw', delay => '1 hour') AS sched2 \gset
BEGIN;
SELECT pgjq.cancel(:sched2);
PREPARE TRANSACTION 'pgjq_wj';
SELECT state FROM pgjq.job(:sched2);

-- producers and workers may wait; others may not
SELECT has_function_privilege('pgjq_producer', 'pgjq.wait_jobs(bigint[], interval, boolean)', 'EXECUTE') AS producer,
       has_function_privilege('pgjq_worker', 'pgjq.wait_jobs(bigint[], interval, boolean)', 'EXECUTE') AS worker,
       has_function_privilege('public', 'pgjq.wait_jobs(bigint[], interval, boolean)', 'EXECUTE') AS public;

SELECT pgjq.drop_queue('qw', force => true);
