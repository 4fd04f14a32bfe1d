--
-- observability: queue_stats through a job's lifecycle, and job(id) in
-- every state.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qv', max_attempts => 1);

-- queue_stats for an empty queue: zero counts, no ages
SELECT queue, paused, ready, scheduled, running, dead, completed, cancelled,
       oldest_ready_age, next_run_at
  FROM pgjq.queue_stats WHERE queue = 'qv';

-- counts through a lifecycle; times are compared, never printed
CREATE VIEW regress.qv_stats AS
	SELECT ready, scheduled, running, dead, completed, cancelled,
	       oldest_ready_age IS NOT NULL AS has_ready_age, next_run_at IS NOT NULL AS has_next_run
	  FROM pgjq.queue_stats WHERE queue = 'qv';
SELECT pgjq.enqueue('qv', '{"n": 1}') AS v1 \gset
SELECT pgjq.enqueue('qv', '{"n": 2}') AS v2 \gset
SELECT * FROM regress.qv_stats;
-- oldest_ready_age grows with time: the age of the oldest ready job
SELECT pg_sleep(0.02);
SELECT oldest_ready_age >= interval '20 milliseconds' AND oldest_ready_age < interval '1 hour'
         AS age_plausible,
       oldest_ready_age = now() - (SELECT enqueued_at FROM pgjq.job(:v1)) AS age_of_v1
  FROM pgjq.queue_stats WHERE queue = 'qv';
-- next_run_at: when the next scheduled job is due
SELECT now() + interval '1 hour' AS in_1_hour \gset
SELECT pgjq.enqueue('qv', run_at => :'in_1_hour') AS v3 \gset
SELECT pgjq.enqueue('qv', run_at => :'in_1_hour'::timestamptz + interval '1 hour') > 0 AS enqueued;
SELECT * FROM regress.qv_stats;
SELECT next_run_at = :'in_1_hour' AS next_run_at_is_v3 FROM pgjq.queue_stats WHERE queue = 'qv';
-- claim, complete, fail (dead), cancel
SELECT id AS c_id, token AS c_token FROM pgjq.claim('qv') \gset
SELECT * FROM regress.qv_stats;
SELECT id AS d_id, token AS d_token FROM pgjq.claim('qv') \gset
SELECT * FROM regress.qv_stats;
SELECT pgjq.complete(:c_id, :c_token);
SELECT pgjq.fail(:d_id, :d_token, 'broken');
SELECT * FROM regress.qv_stats;
SELECT pgjq.cancel(:v3);
SELECT * FROM regress.qv_stats;
-- paused shows in queue_stats too
SELECT pgjq.pause('qv');
SELECT paused FROM pgjq.queue_stats WHERE queue = 'qv';
SELECT pgjq.resume('qv');
-- one row per queue, ordered by nothing in particular: filter by name
SELECT count(*) AS rows_for_qv FROM pgjq.queue_stats WHERE queue = 'qv';

-- job(id) in each state, with its times reduced to facts
CREATE FUNCTION regress.job_facts(id bigint)
RETURNS TABLE (state text, queue text, attempt int, max_attempts int, priority smallint,
               fair_key text, dedup_key text, payload jsonb, worker text, last_error text,
               cancel_requested boolean, enqueued boolean, run_at text, lease_until text,
               finished_at text)
LANGUAGE sql AS $$
	SELECT j.state, j.queue, j.attempt, j.max_attempts, j.priority, j.fair_key, j.dedup_key,
	       j.payload, j.worker, j.last_error, j.cancel_requested,
	       j.enqueued_at <= now(),
	       CASE WHEN j.run_at IS NULL THEN 'null' WHEN j.run_at > now() THEN 'future' ELSE 'past' END,
	       CASE WHEN j.lease_until IS NULL THEN 'null' WHEN j.lease_until > now() THEN 'future' ELSE 'past' END,
	       CASE WHEN j.finished_at IS NULL THEN 'null' WHEN j.finished_at > now() THEN 'future' ELSE 'past' END
	  FROM pgjq.job(id) j
$$;
SELECT pgjq.create_queue('qv_jobs', max_attempts => 1);
-- scheduled
SELECT pgjq.enqueue('qv_jobs', '{"s": 1}', delay => '1 hour', priority => 3::smallint,
                    fair_key => 'f', dedup_key => 'sched') AS j_sched \gset
-- ready
SELECT pgjq.enqueue('qv_jobs', '{"s": 2}', priority => (-1)::smallint, fair_key => 'f',
                    dedup_key => 'ready', max_attempts => 3) AS j_ready \gset
-- running
SELECT pgjq.enqueue('qv_jobs', '{"s": 3}', priority => (-2)::smallint) AS j_running \gset
SELECT id = :j_running AS claimed_it FROM pgjq.claim('qv_jobs', worker => 'w-1');
-- completed
SELECT pgjq.enqueue('qv_jobs', '{"s": 4}', priority => (-3)::smallint) AS j_completed \gset
SELECT token AS t FROM pgjq.claim('qv_jobs', worker => 'w-2') \gset
SELECT pgjq.complete(:j_completed, :t);
-- dead
SELECT pgjq.enqueue('qv_jobs', '{"s": 5}', priority => (-4)::smallint) AS j_dead \gset
SELECT token AS t FROM pgjq.claim('qv_jobs', worker => 'w-3') \gset
SELECT pgjq.fail(:j_dead, :t, 'out of memory');
-- cancelled
SELECT pgjq.enqueue('qv_jobs', '{"s": 6}') AS j_cancelled \gset
SELECT pgjq.cancel(:j_cancelled);

\x on
SELECT 'scheduled' AS expected, * FROM regress.job_facts(:j_sched);
SELECT 'ready' AS expected, * FROM regress.job_facts(:j_ready);
SELECT 'running' AS expected, * FROM regress.job_facts(:j_running);
-- (a completed job keeps its state, attempts, last error and times; what
-- else it keeps is up to the storage engine)
SELECT 'completed' AS expected, state, queue, attempt, last_error, cancel_requested, enqueued,
       run_at, lease_until, finished_at
  FROM regress.job_facts(:j_completed);
SELECT 'dead' AS expected, * FROM regress.job_facts(:j_dead);
SELECT 'cancelled' AS expected, * FROM regress.job_facts(:j_cancelled);
\x off
SELECT regress.counts('qv_jobs');

-- an unknown id, or NULL: no rows
SELECT count(*) AS rows FROM pgjq.job(-1);
SELECT count(*) AS rows FROM pgjq.job(0);
SELECT count(*) AS rows FROM pgjq.job(NULL);
-- exactly one row per known id
SELECT count(*) AS rows FROM pgjq.job(:j_dead);

SELECT pgjq.drop_queue('qv', force => true);
SELECT pgjq.drop_queue('qv_jobs', force => true);
-- the unfinished jobs of a dropped queue are gone
SELECT count(*) AS rows FROM pgjq.job(:j_ready);
DROP VIEW regress.qv_stats;
DROP FUNCTION regress.job_facts(bigint);
