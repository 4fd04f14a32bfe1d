--
-- claim: fencing tokens, order (priority, round-robin over fair keys, FIFO),
-- batch limits, paused queues, the lease and worker arguments.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qc');

-- nothing to claim: no rows
SELECT count(*) AS claimed FROM pgjq.claim('qc');

-- a claim returns the job with a new token, attempt 1 and a lease of the
-- queue's length (30 s), measured around the call
SELECT pgjq.enqueue('qc', '{"job": 1}', fair_key => 'k') AS j1 \gset
CREATE TEMP TABLE c1 AS
	SELECT c.*, now() AS t_before, clock_timestamp() AS t_after FROM pgjq.claim('qc') c;
SELECT id = :j1 AS is_j1, token > 0 AS has_token, attempt, payload, fair_key, priority,
       enqueued_at = (SELECT enqueued_at FROM pgjq.job(:j1)) AS enqueued_at_matches,
       lease_until BETWEEN t_before + interval '30 seconds' AND t_after + interval '30 seconds'
         AS lease_30s
  FROM c1;
SELECT token AS t1 FROM c1 \gset
-- the job is running, with the lease the claim returned
SELECT j.state, j.attempt, j.lease_until = c1.lease_until AS same_lease, j.worker
  FROM pgjq.job(:j1) j, c1;
-- a running job is not handed out again
SELECT count(*) AS claimed FROM pgjq.claim('qc');

-- fencing: each claim call draws a new token, larger than any before, shared
-- by the jobs of its batch
SELECT count(*) FROM pgjq.enqueue_many('qc', array_fill('{}'::jsonb, ARRAY[5]));
CREATE TEMP TABLE c2 AS SELECT * FROM pgjq.claim('qc', 3);
SELECT count(*) AS jobs, count(DISTINCT id) AS distinct_jobs, count(DISTINCT token) AS tokens,
       min(token) > :t1 AS token_grew
  FROM c2;
SELECT min(token) AS t2 FROM c2 \gset
CREATE TEMP TABLE c3 AS SELECT * FROM pgjq.claim('qc', 3);
SELECT count(*) AS jobs, count(DISTINCT token) AS tokens, min(token) > :t2 AS token_grew,
       NOT EXISTS (SELECT 1 FROM c2 WHERE c2.id IN (SELECT id FROM c3)) AS no_job_twice
  FROM c3;
-- a job claimed again after a failed attempt gets a new token; the old one is stale
SELECT pgjq.fail(:j1, :t1, 'try again', retry_in => '0');
SELECT pgjq.promote() >= 1 AS promoted;
CREATE TEMP TABLE c4 AS SELECT * FROM pgjq.claim('qc');
SELECT id = :j1 AS is_j1, attempt, token > (SELECT max(token) FROM c3) AS token_grew FROM c4;
SELECT token AS t4 FROM c4 \gset
SELECT pgjq.complete(:j1, :t1) AS complete_with_old_token;
SELECT pgjq.heartbeat(:j1, :t1) IS NULL AS heartbeat_with_old_token_is_null;
SELECT pgjq.fail(:j1, :t1) AS fail_with_old_token;
SELECT pgjq.snooze(:j1, :t1, '1 second') AS snooze_with_old_token;
SELECT state, attempt FROM pgjq.job(:j1);
-- a token of another job does not fit either
SELECT pgjq.complete(:j1, (SELECT min(token) FROM c2)) AS complete_with_other_token;
SELECT pgjq.complete(:j1, :t4) AS complete_with_current_token;
SELECT pgjq.complete(:j1, :t4) AS complete_twice;
SELECT pgjq.drop_queue('qc', force => true);

-- order: smaller priority first, FIFO within a priority
SELECT pgjq.create_queue('qc_prio');
CREATE TEMP TABLE prio_jobs (n int, id bigint);
INSERT INTO prio_jobs
	SELECT n, pgjq.enqueue('qc_prio', jsonb_build_object('n', n), priority => p::smallint)
	  FROM (VALUES (1, 5), (2, 0), (3, -1), (4, 5), (5, 0), (6, 32767), (7, -32768), (8, -1)) v(n, p)
	 ORDER BY n;
SELECT c.ordinality AS ord, c.payload->>'n' AS n, c.priority
  FROM pgjq.claim('qc_prio', 10) WITH ORDINALITY c ORDER BY c.ordinality;
SELECT pgjq.drop_queue('qc_prio', force => true);

-- priority goes before fairness: a key's urgent jobs come before the other
-- keys' normal ones
SELECT pgjq.create_queue('qc_mix');
SELECT count(*) FROM pgjq.enqueue_many('qc_mix', array_fill('{}'::jsonb, ARRAY[3]),
                                       fair_keys => ARRAY['b', 'c', 'd']);
SELECT count(*) FROM pgjq.enqueue_many('qc_mix', array_fill('{}'::jsonb, ARRAY[3]),
                                       priority => (-1)::smallint, fair_keys => ARRAY['a', 'a', 'a']);
SELECT c.ordinality AS ord, c.fair_key, c.priority FROM pgjq.claim('qc_mix', 6) WITH ORDINALITY c ORDER BY c.ordinality;
SELECT pgjq.drop_queue('qc_mix', force => true);

-- round-robin over fair keys (the check from the issue): 1,000 jobs for key
-- A enqueued first, then 10 each for B and C: the first 30 claimed contain
-- all 10 of B and all 10 of C, both in one call of batch 30 ...
SELECT pgjq.create_queue('qc_rr1');
SELECT pgjq.create_queue('qc_rr2');
SELECT count(*) FROM (
	SELECT pgjq.enqueue_many(q, (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 1000) i),
	                         fair_keys => array_fill('A'::text, ARRAY[1000]))
	  FROM (VALUES ('qc_rr1'), ('qc_rr2')) v(q)) s;
SELECT count(*) FROM (
	SELECT pgjq.enqueue_many(q, (SELECT array_agg(jsonb_build_object('i', i)) FROM generate_series(1, 20) i),
	                         fair_keys => (SELECT array_agg(CASE WHEN i % 2 = 0 THEN 'B' ELSE 'C' END ORDER BY i)
	                                         FROM generate_series(1, 20) i))
	  FROM (VALUES ('qc_rr1'), ('qc_rr2')) v(q)) s;
CREATE TEMP TABLE rr1 AS SELECT c.*, c.ordinality AS n FROM pgjq.claim('qc_rr1', 30) WITH ORDINALITY c;
SELECT fair_key, count(*) FROM rr1 GROUP BY fair_key ORDER BY fair_key;
-- ... and in 30 calls of batch 1
CREATE TEMP TABLE rr2 (n int, id bigint, fair_key text, payload jsonb);
DO $$
BEGIN
	FOR n IN 1..30 LOOP
		INSERT INTO rr2 SELECT n, c.id, c.fair_key, c.payload FROM pgjq.claim('qc_rr2') c;
	END LOOP;
END
$$;
SELECT fair_key, count(*) FROM rr2 GROUP BY fair_key ORDER BY fair_key;
-- one at a time, the keys take turns: any three claims in a row have three keys
SELECT count(*) AS windows, count(*) FILTER (WHERE keys = 3) AS windows_with_3_keys
  FROM (SELECT n,
               (SELECT count(DISTINCT w.fair_key) FROM rr2 w WHERE w.n BETWEEN r.n AND r.n + 2) AS keys
          FROM rr2 r WHERE r.n <= 28) s;
-- within a key, first in, first out (ids and payloads ascend, A starts at 1)
SELECT fair_key, count(*) AS jobs,
       bool_and(prev_id IS NULL OR id > prev_id) AS ids_ascend,
       min((payload->>'i')::int) AS first_i
  FROM (SELECT fair_key, id, payload, lag(id) OVER (PARTITION BY fair_key ORDER BY n) AS prev_id
          FROM rr1) s
 GROUP BY fair_key ORDER BY fair_key;
SELECT fair_key, count(*) AS jobs,
       bool_and(prev_id IS NULL OR id > prev_id) AS ids_ascend,
       min((payload->>'i')::int) AS first_i
  FROM (SELECT fair_key, id, payload, lag(id) OVER (PARTITION BY fair_key ORDER BY n) AS prev_id
          FROM rr2) s
 GROUP BY fair_key ORDER BY fair_key;
-- once B and C are drained, A gets everything
SELECT fair_key, count(*) FROM pgjq.claim('qc_rr1', 30) GROUP BY fair_key;
SELECT regress.counts('qc_rr1');
SELECT pgjq.drop_queue('qc_rr1', force => true);
SELECT pgjq.drop_queue('qc_rr2', force => true);

-- with more keys than the batch, successive calls go on where the last one
-- stopped: five calls of batch 2 over five keys serve every key once before
-- any key twice
SELECT pgjq.create_queue('qc_cycle');
SELECT count(*) FROM pgjq.enqueue_many('qc_cycle', array_fill('{}'::jsonb, ARRAY[10]),
                                       fair_keys => ARRAY['k1', 'k2', 'k3', 'k4', 'k5', 'k1', 'k2', 'k3', 'k4', 'k5']);
CREATE TEMP TABLE cyc (n serial, fair_key text);
DO $$
BEGIN
	FOR i IN 1..5 LOOP
		INSERT INTO cyc (fair_key) SELECT c.fair_key FROM pgjq.claim('qc_cycle', 2) c;
	END LOOP;
END
$$;
SELECT count(*) AS picks,
       count(DISTINCT fair_key) FILTER (WHERE n <= 5) AS keys_in_first_5,
       count(DISTINCT fair_key) FILTER (WHERE n > 5) AS keys_in_last_5
  FROM cyc;
SELECT pgjq.drop_queue('qc_cycle', force => true);

-- NULL and '' fair keys form one group, returned as NULL: with 6 jobs in
-- that group and 6 for 'x', 6 claims take 3 of each
SELECT pgjq.create_queue('qc_null');
SELECT count(*) FROM pgjq.enqueue_many('qc_null', array_fill('{}'::jsonb, ARRAY[12]),
                                       fair_keys => ARRAY[NULL, '', '', '', '', '', 'x', 'x', 'x', 'x', 'x', 'x']);
SELECT fair_key, count(*) FROM pgjq.claim('qc_null', 6) GROUP BY fair_key ORDER BY fair_key;
SELECT pgjq.drop_queue('qc_null', force => true);

-- batch is 1 .. 10000: the whole range works, NULL means 1, the rest is 22023
SELECT pgjq.create_queue('qc_batch');
SELECT count(*) FROM pgjq.enqueue_many('qc_batch', array_fill('{}'::jsonb, ARRAY[10005]));
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', 10000);
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', NULL);
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', batch => 1);
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', 0);
\echo :SQLSTATE
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', -1);
\echo :SQLSTATE
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', 10001);
\echo :SQLSTATE
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', 1000000);
\echo :SQLSTATE
-- the rejected calls claimed nothing
SELECT regress.counts('qc_batch');
-- a batch larger than the backlog returns what there is
SELECT count(*) AS claimed FROM pgjq.claim('qc_batch', 100);
SELECT pgjq.drop_queue('qc_batch', force => true);

-- a paused queue hands out nothing; resumed, it does again
SELECT pgjq.create_queue('qc_pause');
SELECT count(*) FROM pgjq.enqueue_many('qc_pause', array_fill('{}'::jsonb, ARRAY[3]));
SELECT pgjq.pause('qc_pause');
SELECT count(*) AS claimed_while_paused FROM pgjq.claim('qc_pause', 10);
SELECT regress.counts('qc_pause');
SELECT pgjq.resume('qc_pause');
SELECT count(*) AS claimed_after_resume FROM pgjq.claim('qc_pause', 10);
-- pausing does not touch running jobs: they can still complete
SELECT pgjq.enqueue('qc_pause') AS p1 \gset
SELECT token AS p1_token FROM pgjq.claim('qc_pause') \gset
SELECT pgjq.pause('qc_pause');
SELECT pgjq.heartbeat(:p1, :p1_token) IS NOT NULL AS heartbeat_ok;
SELECT pgjq.complete(:p1, :p1_token);
SELECT regress.counts('qc_pause');
SELECT pgjq.drop_queue('qc_pause', force => true);

-- scheduled jobs are not claimable before they are due and promoted
SELECT pgjq.create_queue('qc_sched');
SELECT pgjq.enqueue('qc_sched', delay => '1 hour') > 0 AS enqueued;
SELECT count(*) AS claimed FROM pgjq.claim('qc_sched');

-- the lease argument overrides the queue's lease; worker is recorded
SELECT pgjq.enqueue('qc_sched') AS l1 \gset
CREATE TEMP TABLE cl AS
	SELECT c.*, now() AS t_before, clock_timestamp() AS t_after
	  FROM pgjq.claim('qc_sched', lease => '5 minutes', worker => 'host-1:4242') c;
SELECT id = :l1 AS is_l1,
       lease_until BETWEEN t_before + interval '5 minutes' AND t_after + interval '5 minutes' AS lease_5min
  FROM cl;
SELECT j.worker, j.lease_until = cl.lease_until AS same_lease FROM pgjq.job(:l1) j, cl;
-- lease has the range of the queue setting: (0, 7 days]
SELECT pgjq.enqueue('qc_sched') > 0 AS enqueued;
SELECT count(*) FROM pgjq.claim('qc_sched', lease => '0');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim('qc_sched', lease => '-1 second');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim('qc_sched', lease => '7 days 1 second');
\echo :SQLSTATE
SELECT regress.counts('qc_sched');
CREATE TEMP TABLE cl7 AS
	SELECT c.*, now() AS t_before, clock_timestamp() AS t_after
	  FROM pgjq.claim('qc_sched', lease => '7 days') c;
SELECT lease_until BETWEEN t_before + interval '7 days' AND t_after + interval '7 days' AS lease_7d FROM cl7;

-- a claim in a rolled-back transaction leaves the job ready
SELECT pgjq.enqueue('qc_sched') AS rb \gset
BEGIN;
SELECT count(*) AS claimed FROM pgjq.claim('qc_sched');
ROLLBACK;
SELECT state, attempt FROM pgjq.job(:rb);

-- unknown queue
SELECT count(*) FROM pgjq.claim('qc_nope');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qc_sched', force => true);
