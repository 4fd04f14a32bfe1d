--
-- limits: concurrency, key_concurrency, rate and burst (shared memory, so
-- they need the preload that test/pgjq.conf gives), exact through every way
-- a job stops running.
--
\set VERBOSITY terse

CREATE VIEW regress.limits AS
	SELECT q.queue, q.concurrency, q.key_concurrency, q.rate, q.burst,
	       s.concurrency AS stats_concurrency, s.key_concurrency AS stats_key_concurrency,
	       s.rate AS stats_rate
	  FROM pgjq.list_queues() q JOIN pgjq.queue_stats s USING (queue)
	 WHERE q.queue LIKE 'ql%';

-- no limits by default; held_back (claims cut short by a limit) starts at 0
-- and stays there without limits
SELECT pgjq.create_queue('ql_none');
SELECT * FROM regress.limits;
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'ql_none';
SELECT pgjq.enqueue('ql_none') > 0 AS enqueued;
SELECT count(*) AS claimed FROM pgjq.claim('ql_none', 10);
SELECT count(*) AS claimed FROM pgjq.claim('ql_none', 10);
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'ql_none';
SELECT pgjq.drop_queue('ql_none', force => true);

---------------------------------------------------------------- concurrency
SELECT pgjq.create_queue('ql', concurrency => 2);
SELECT * FROM regress.limits;
SELECT count(*) FROM pgjq.enqueue_many('ql', array_fill('{}'::jsonb, ARRAY[8]));
-- at most 2 running, however large the batch and however many calls
CREATE TEMP TABLE run AS SELECT * FROM pgjq.claim('ql', 10);
SELECT count(*) AS claimed FROM run;
SELECT count(*) AS claimed FROM pgjq.claim('ql', 10);
SELECT running, ready, held_back FROM pgjq.queue_stats WHERE queue = 'ql';
-- every way a job stops running frees its slot, once committed:
-- complete
SELECT id AS r1, token AS r1_token FROM run ORDER BY id LIMIT 1 \gset
SELECT id AS r2, token AS r2_token FROM run ORDER BY id DESC LIMIT 1 \gset
BEGIN;
SELECT pgjq.complete(:r1, :r1_token);
ROLLBACK;
SELECT count(*) AS claimed_after_rollback FROM pgjq.claim('ql');
SELECT pgjq.complete(:r1, :r1_token);
SELECT id AS r3, token AS r3_token FROM pgjq.claim('ql', 10) \gset
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('ql');
-- fail (retry)
SELECT pgjq.fail(:r3, :r3_token, 'x', retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT id AS r4, token AS r4_token FROM pgjq.claim('ql', 10) \gset
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('ql');
-- snooze
SELECT pgjq.snooze(:r4, :r4_token, '1 hour');
SELECT id AS r5, token AS r5_token FROM pgjq.claim('ql', 10) \gset
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('ql');
-- cancel, learnt at the next heartbeat
SELECT pgjq.cancel(:r5);
SELECT count(*) AS claimed_while_cancel_requested FROM pgjq.claim('ql');
SELECT pgjq.heartbeat(:r5, :r5_token) IS NULL AS heartbeat_null;
SELECT id AS r6, token AS r6_token FROM pgjq.claim('ql', 10) \gset
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('ql');
-- rescue of an expired lease
SELECT pgjq.complete(:r6, :r6_token);
SELECT id AS r7, token AS r7_token FROM pgjq.claim('ql', 10, lease => '10 milliseconds') \gset
SELECT pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT count(*) AS claimed FROM pgjq.claim('ql', 10);
SELECT running FROM pgjq.queue_stats WHERE queue = 'ql';
-- a rolled-back claim gives its slots back
SELECT pgjq.complete(array_agg(id), array_agg(token)) AS completed
  FROM (SELECT :r2::bigint AS id, :r2_token::bigint AS token) s;
SELECT running FROM pgjq.queue_stats WHERE queue = 'ql';
BEGIN;
SELECT count(*) AS claimed_in_rolled_back FROM pgjq.claim('ql', 10);
ROLLBACK;
SELECT running FROM pgjq.queue_stats WHERE queue = 'ql';
-- raising the limit lets more run; 0 removes it; NULL leaves it
SELECT count(*) FROM pgjq.enqueue_many('ql', array_fill('{}'::jsonb, ARRAY[5]));
SELECT pgjq.alter_queue('ql', concurrency => 3);
SELECT count(*) AS claimed FROM pgjq.claim('ql', 10);
SELECT running, ready FROM pgjq.queue_stats WHERE queue = 'ql';
SELECT pgjq.alter_queue('ql', lease => '1 minute');
SELECT queue, concurrency FROM regress.limits;
SELECT pgjq.alter_queue('ql', concurrency => 0);
SELECT queue, concurrency FROM regress.limits;
SELECT count(*) AS claimed_without_limit FROM pgjq.claim('ql', 10);
SELECT running, ready, held_back > 0 AS held_back_counted FROM pgjq.queue_stats WHERE queue = 'ql';
SELECT pgjq.drop_queue('ql', force => true);

---------------------------------------------------------------- key_concurrency
SELECT pgjq.create_queue('ql_key', key_concurrency => 1);
SELECT count(*) FROM pgjq.enqueue_many('ql_key', array_fill('{}'::jsonb, ARRAY[7]),
                                       fair_keys => ARRAY['a', 'a', 'a', 'b', 'b', NULL, NULL]);
-- one per key (NULL is a key too)
SELECT fair_key, count(*) FROM pgjq.claim('ql_key', 10) GROUP BY fair_key ORDER BY fair_key;
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('ql_key', 10);
-- a key's slot frees when its job finishes
SELECT pgjq.enqueue('ql_key', fair_key => 'c') > 0 AS enqueued;
SELECT fair_key, count(*) FROM pgjq.claim('ql_key', 10) GROUP BY fair_key ORDER BY fair_key;
-- two per key: each key with jobs left gets one more
SELECT pgjq.alter_queue('ql_key', key_concurrency => 2);
SELECT fair_key, count(*) FROM pgjq.claim('ql_key', 10) GROUP BY fair_key ORDER BY fair_key;
SELECT running, ready FROM pgjq.queue_stats WHERE queue = 'ql_key';
-- a limit below the running count stops new claims; running jobs go on
SELECT pgjq.enqueue('ql_key', fair_key => 'd') > 0 AS enqueued;
SELECT pgjq.alter_queue('ql_key', concurrency => 5);
SELECT count(*) AS claimed_over_limit FROM pgjq.claim('ql_key', 10);
SELECT running, ready FROM pgjq.queue_stats WHERE queue = 'ql_key';
SELECT * FROM regress.limits;
SELECT pgjq.drop_queue('ql_key', force => true);

---------------------------------------------------------------- rate
-- 10 claims per second, bursts of 2
SELECT pgjq.create_queue('ql_rate', rate => 10, burst => 2);
SELECT * FROM regress.limits;
SELECT count(*) FROM pgjq.enqueue_many('ql_rate', array_fill('{}'::jsonb, ARRAY[10]));
SELECT count(*) AS claimed FROM pgjq.claim('ql_rate', 10);
SELECT count(*) AS claimed_right_after FROM pgjq.claim('ql_rate', 10);
SELECT pg_sleep(0.3);
-- the bucket refills, up to the burst
SELECT count(*) AS claimed_after_refill FROM pgjq.claim('ql_rate', 10);
-- without burst, the bucket holds max(1, rate)
SELECT pgjq.create_queue('ql_slow', rate => 0.5);
SELECT count(*) FROM pgjq.enqueue_many('ql_slow', array_fill('{}'::jsonb, ARRAY[3]));
SELECT count(*) AS claimed FROM pgjq.claim('ql_slow', 10);
SELECT count(*) AS claimed_right_after FROM pgjq.claim('ql_slow', 10);
SELECT pgjq.alter_queue('ql_slow', rate => 0);
SELECT count(*) AS claimed_without_rate FROM pgjq.claim('ql_slow', 10);
SELECT pgjq.drop_queue('ql_rate', force => true);
SELECT pgjq.drop_queue('ql_slow', force => true);

---------------------------------------------------------------- bad limits: 22023
SELECT pgjq.create_queue('ql_bad', concurrency => -1);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', concurrency => 1000001);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', key_concurrency => -1);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', rate => -0.1);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', rate => 'NaN');
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', rate => 'Infinity');
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', rate => 1000001);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', burst => -1);
\echo :SQLSTATE
SELECT pgjq.create_queue('ql_bad', burst => 1000001);
\echo :SQLSTATE
SELECT count(*) AS bad_queues FROM pgjq.list_queues() WHERE queue = 'ql_bad';
SELECT pgjq.create_queue('ql_max', concurrency => 1000000, key_concurrency => 1000000,
                         rate => 1000000, burst => 1000000);
SELECT * FROM regress.limits;
SELECT pgjq.alter_queue('ql_max', concurrency => -1);
\echo :SQLSTATE
SELECT * FROM regress.limits;
SELECT pgjq.drop_queue('ql_max');

DROP VIEW regress.limits;
