--
-- limits_wait: the shared-memory features as far as one session shows them.
--   * concurrency and key_concurrency are exact through every way a job
--     stops running and through rollbacks (of claims and of outcomes, whole
--     transactions and savepoints);
--   * a key at its limit is skipped without touching its jobs;
--   * rate limits claim starts (token bucket with burst);
--   * waiting claims, claims from several queues and await(), alone.
-- (test/sql/limits.sql has the basic option checks; what needs several
-- sessions is in test/specs/limits_concurrent.spec and test/t/050_wait_limits.pl.)
--
-- Durations are never printed: a waiting call is timed with clock_timestamp()
-- and compared with generous bounds (the test machines are busy).  Besides
-- the job counts of queue_stats, each step shows the shared-memory counter of
-- the queue's running jobs (pgjq._limits(), internal), which must always equal
-- the running jobs in the table: a counter too high holds claims back for
-- ever, one too low lets claims exceed the limit.
--
\set VERBOSITY terse

CREATE EXTENSION pgrowlocks;

-- running jobs of one queue (in the table) and its shared counter
CREATE FUNCTION regress.lim(q text) RETURNS text
LANGUAGE sql VOLATILE AS $$
	SELECT format('running %s counter %s', s.running,
				  coalesce((SELECT l.running FROM pgjq._limits() l
							 WHERE l.queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = q)), 0))
	  FROM pgjq.queue_stats s WHERE s.queue = q
$$;

-- how many of the queue's ready jobs are row-locked (by any transaction)
CREATE FUNCTION regress.lim_ready_locked(q text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
	SELECT count(*)
	  FROM pgrowlocks('pgjq.job') l
	  JOIN pgjq.job j ON j.ctid = l.locked_row
	 WHERE j.state = 'r' AND j.queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = q)
$$;

-- ===================================================== options and errors

SELECT pgjq.create_queue('lim_opts', concurrency => 2, key_concurrency => 1, rate => 2.5, burst => 4);
-- 0 means no limit: shown as NULL
SELECT pgjq.create_queue('lim_zero', concurrency => 0, key_concurrency => 0, rate => 0, burst => 0);
SELECT pgjq.create_queue('lim_frac', rate => 0.001);
SELECT queue, concurrency, key_concurrency, rate, burst
  FROM pgjq.list_queues() WHERE queue LIKE 'lim\_%' ORDER BY queue;
-- the columns of list_queues() and the limit columns of queue_stats
SELECT a.name, format_type(a.typ, NULL) AS type
  FROM pg_proc p, unnest(p.proargnames, p.proallargtypes) WITH ORDINALITY AS a(name, typ, n)
 WHERE p.oid = 'pgjq.list_queues'::regproc
 ORDER BY a.n;
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a
 WHERE a.attrelid = 'pgjq.queue_stats'::regclass AND a.attnum > 0
   AND a.attname IN ('concurrency', 'key_concurrency', 'rate', 'held_back')
 ORDER BY a.attnum;
SELECT queue, concurrency, key_concurrency, rate
  FROM pgjq.queue_stats WHERE queue LIKE 'lim\_%' ORDER BY queue;
-- with pgjq preloaded, held_back is a count (NULL would mean "not
-- preloaded"), also before the queue's first claim
SELECT queue, held_back FROM pgjq.queue_stats WHERE queue LIKE 'lim\_%' ORDER BY queue;

-- out of range: invalid_parameter_value, and nothing is created or changed
SELECT pgjq.create_queue('lim_bad', key_concurrency => 1000001);
\echo :SQLSTATE
SELECT pgjq.create_queue('lim_bad', rate => 1000000.5);
\echo :SQLSTATE
SELECT pgjq.create_queue('lim_bad', rate => '-Infinity');
\echo :SQLSTATE
SELECT pgjq.create_queue('lim_bad', rate => '-0.001');
\echo :SQLSTATE
SELECT pgjq.alter_queue('lim_opts', concurrency => -1);
\echo :SQLSTATE
SELECT pgjq.alter_queue('lim_opts', key_concurrency => 1000001);
\echo :SQLSTATE
SELECT pgjq.alter_queue('lim_opts', rate => 'NaN');
\echo :SQLSTATE
SELECT pgjq.alter_queue('lim_opts', rate => 'Infinity');
\echo :SQLSTATE
SELECT pgjq.alter_queue('lim_opts', burst => -5);
\echo :SQLSTATE
-- a bad limit next to good ones changes none of them
SELECT pgjq.alter_queue('lim_opts', concurrency => 7, lease => '5 minutes', rate => -1);
\echo :SQLSTATE
-- an unknown queue: undefined_object
SELECT pgjq.alter_queue('lim_nope', concurrency => 1);
\echo :SQLSTATE
SELECT count(*) AS bad_created FROM pgjq.list_queues() WHERE queue = 'lim_bad';
SELECT queue, lease, concurrency, key_concurrency, rate, burst FROM pgjq.list_queues() WHERE queue = 'lim_opts';

-- alter_queue: NULL leaves a limit unchanged, 0 removes it, other settings stay
SELECT pgjq.alter_queue('lim_opts', lease => '1 minute');
SELECT queue, lease, concurrency, key_concurrency, rate, burst FROM pgjq.list_queues() WHERE queue = 'lim_opts';
SELECT pgjq.alter_queue('lim_opts', concurrency => 0, rate => 0);
SELECT queue, lease, concurrency, key_concurrency, rate, burst FROM pgjq.list_queues() WHERE queue = 'lim_opts';
SELECT pgjq.alter_queue('lim_opts', key_concurrency => 0, burst => 0, concurrency => 3);
SELECT queue, lease, concurrency, key_concurrency, rate, burst FROM pgjq.list_queues() WHERE queue = 'lim_opts';
SELECT queue, concurrency, key_concurrency, rate FROM pgjq.queue_stats WHERE queue = 'lim_opts';
SELECT pgjq.drop_queue('lim_opts');
SELECT pgjq.drop_queue('lim_zero');
SELECT pgjq.drop_queue('lim_frac');

-- Every claim of this file is recorded here, so a step can finish all the
-- jobs it holds: complete(ids, tokens) skips stale pairs.
CREATE TEMP TABLE held (id bigint, token bigint);
CREATE FUNCTION regress.lim_finish() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
	WITH done AS (SELECT coalesce(pgjq.complete(array_agg(id), array_agg(token)), 0) AS n
					FROM held HAVING count(*) > 0),
		 gone AS (DELETE FROM held RETURNING 1)
	SELECT coalesce((SELECT n FROM done), 0) WHERE (SELECT count(*) FROM gone) >= 0
$$;

-- ====================================================== queue concurrency

SELECT pgjq.create_queue('lim_c', concurrency => 2, backoff_base => '1 hour');
CREATE TEMP TABLE lim_c_ids AS
SELECT id FROM pgjq.enqueue_many('lim_c', array_fill('{}'::jsonb, ARRAY[40])) id;
SELECT count(*) FROM lim_c_ids;
SELECT regress.lim('lim_c');
-- a claim never takes more than the limit; the cut counts in held_back
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_c';
-- at the limit: nothing, whatever the batch (each cut claim is counted)
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 1);
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 100);
SELECT regress.lim('lim_c');
SELECT ready, running, held_back FROM pgjq.queue_stats WHERE queue = 'lim_c';
-- a claim that gets all it asked for is not counted as held back
SELECT pgjq.alter_queue('lim_c', concurrency => 3);
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 1) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_c';
-- lowering the limit below the running jobs hands out nothing until enough finish
SELECT pgjq.alter_queue('lim_c', concurrency => 1);
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 1);
SELECT pgjq.complete(id, token) FROM held ORDER BY id LIMIT 2;
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 1);
SELECT regress.lim('lim_c');
SELECT regress.lim_finish() AS finished;
SELECT pgjq.alter_queue('lim_c', concurrency => 2);

-- complete frees a slot, exactly one
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 2);
SELECT id AS c1, token AS t1 FROM held ORDER BY id LIMIT 1 \gset
SELECT id AS c2, token AS t2 FROM held ORDER BY id DESC LIMIT 1 \gset
SELECT pgjq.complete(:c1, :t1);
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
-- a stale outcome frees nothing
SELECT pgjq.complete(:c1, :t1) AS stale_complete;
SELECT pgjq.fail(:c1, :t1) AS stale_fail;
SELECT pgjq.snooze(:c1, :t1, '1 s') AS stale_snooze;
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
-- complete(ids, tokens) frees as many slots as it completed
SELECT regress.lim_finish() AS finished;
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');

-- fail with a retry frees the slot (the job waits for its retry)
SELECT id AS c1, token AS t1 FROM held ORDER BY id LIMIT 1 \gset
SELECT id AS c2, token AS t2 FROM held ORDER BY id DESC LIMIT 1 \gset
SELECT pgjq.fail(:c1, :t1, 'boom');
SELECT state FROM pgjq.job(:c1);
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- snooze frees the slot
SELECT pgjq.snooze(:c2, :t2, '1 hour');
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- heartbeat keeps the slot
SELECT h.id AS c1, h.token AS t1 FROM held h, pgjq.job(h.id) j WHERE j.state = 'running' ORDER BY h.id LIMIT 1 \gset
SELECT pgjq.heartbeat(:c1, :t1) IS NOT NULL AS extended;
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
-- cancel of a running job frees the slot only when the job ends, at its
-- next heartbeat (or outcome)
SELECT pgjq.cancel(:c1);
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
SELECT pgjq.heartbeat(:c1, :t1) IS NULL AS heartbeat_null;
SELECT state FROM pgjq.job(:c1);
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- cancel of a ready job frees nothing (it held no slot)
SELECT pgjq.cancel(min(i.id)) FROM lim_c_ids i, pgjq.job(i.id) j WHERE j.state = 'ready';
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');

-- fail with no attempts left (dead) frees the slot
SELECT regress.lim_finish() AS finished;
SELECT pgjq.enqueue('lim_c', '{"last": true}', priority => -1, max_attempts => 1) AS dj \gset
SELECT id = :dj AS is_dj, token AS dt FROM pgjq.claim('lim_c', 1) \gset
SELECT :'is_dj' AS is_dj;
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 1);
SELECT regress.lim('lim_c');
SELECT pgjq.fail(:dj, :dt, 'fatal');
SELECT state FROM pgjq.job(:dj);
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');

-- rescue of an expired lease frees the slot
SELECT regress.lim_finish() AS finished;
SELECT id AS c1, token AS t1 FROM pgjq.claim('lim_c', 1, lease => '10 milliseconds') \gset
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 1);
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 1);
SELECT regress.lim('lim_c');
SELECT pg_sleep(0.1);
SELECT pgjq.rescue() >= 1 AS rescued;
SELECT state, last_error FROM pgjq.job(:c1);
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');

-- a claim that rolls back gives its slot back
SELECT regress.lim_finish() AS finished;
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 1);
BEGIN;
SELECT count(*) AS claimed_in_xact FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
ROLLBACK;
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- also a claim in a savepoint that rolls back, the transaction going on
SELECT pgjq.complete(id, token) FROM held ORDER BY id DESC LIMIT 1;
BEGIN;
SAVEPOINT s;
SELECT count(*) AS claimed_in_savepoint FROM pgjq.claim('lim_c', 5);
SELECT count(*) AS claimed_after FROM pgjq.claim('lim_c', 5);
ROLLBACK TO SAVEPOINT s;
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed_after_rollback_to FROM c;
SELECT regress.lim('lim_c');
COMMIT;
SELECT regress.lim('lim_c');
-- a released savepoint keeps its claim; a failed statement after it does
-- not give the slot back twice
SELECT regress.lim_finish() AS finished;
BEGIN;
SAVEPOINT s1;
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 1);
RELEASE SAVEPOINT s1;
SAVEPOINT s2;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT s2;
COMMIT;
SELECT regress.lim('lim_c');
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- an outcome that rolls back frees nothing
SELECT regress.lim_finish() AS finished;
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 2);
BEGIN;
SELECT pgjq.complete(id, token) FROM held ORDER BY id LIMIT 1;
ROLLBACK;
SELECT count(*) AS claimed FROM pgjq.claim('lim_c', 5);
SELECT regress.lim('lim_c');
-- a rolled-back claim that got fewer jobs than it reserved gives back only
-- its own jobs: the running ones still count
SELECT regress.lim_finish() AS finished;
SELECT pgjq.purge('lim_c');
SELECT pgjq.alter_queue('lim_c', concurrency => 5);
SELECT count(*) FROM pgjq.enqueue_many('lim_c', array_fill('{}'::jsonb, ARRAY[3]));
INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 2);
BEGIN;
SELECT count(*) AS claimed_in_xact FROM pgjq.claim('lim_c', 3);
ROLLBACK;
SELECT regress.lim('lim_c');
SELECT count(*) FROM pgjq.enqueue_many('lim_c', array_fill('{}'::jsonb, ARRAY[5]));
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 10) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_c');
-- removing the limit: everything ready can be claimed
SELECT pgjq.alter_queue('lim_c', concurrency => 0);
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_c', 100) RETURNING 1)
SELECT count(*) > 0 AS claimed_rest FROM c;
SELECT ready FROM pgjq.queue_stats WHERE queue = 'lim_c';

-- drop_queue(force) lowers the counters of its running jobs
SELECT pgjq.alter_queue('lim_c', concurrency => 2);
SELECT queue_id AS lim_c_id FROM pgjq.queue WHERE name = 'lim_c' \gset
SELECT running > 0 AS has_running FROM pgjq.queue_stats WHERE queue = 'lim_c';
SELECT pgjq.drop_queue('lim_c', force => true);
SELECT coalesce(sum(running), 0) AS counter_after_drop FROM pgjq._limits() WHERE queue_id = :lim_c_id;
DELETE FROM held;

-- held_back counts the claims a limit cut short, not those that found fewer
-- jobs than they asked for: here the limits leave room for more than there is
SELECT pgjq.create_queue('lim_e', concurrency => 2, rate => 100);
SELECT count(*) AS claimed FROM pgjq.claim('lim_e', 5);
SELECT pgjq.enqueue('lim_e') IS NOT NULL AS enqueued;
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_e', 5) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_e');
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_e';
SELECT regress.lim_finish() AS finished;
SELECT pgjq.drop_queue('lim_e');

-- ======================================================== key concurrency

SELECT pgjq.create_queue('lim_k', key_concurrency => 1, backoff_base => '1 hour');
CREATE TEMP TABLE lim_k_ids AS SELECT id FROM pgjq.enqueue_many('lim_k',
	ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}', '{"n": 5}', '{"n": 6}', '{"n": 7}']::jsonb[],
	fair_keys => ARRAY['a', 'a', 'a', 'b', 'b', 'c', NULL]) id;
SELECT count(*) FROM lim_k_ids;
-- a batch of 3: one job of each of three keys
BEGIN;
SELECT count(*) AS claimed, count(DISTINCT coalesce(fair_key, '(null)')) AS keys FROM pgjq.claim('lim_k', 3);
ROLLBACK;
-- a batch of 10: the keys at their limit are skipped, the other keys fill
-- the batch (NULL is a key too)
BEGIN;
CREATE TEMP TABLE kc AS SELECT * FROM pgjq.claim('lim_k', 10);
SELECT fair_key, payload, attempt FROM kc ORDER BY payload->>'n';
-- the jobs held back are untouched: still ready, attempt 0, and not locked
-- by the claiming transaction
SELECT j.state, j.attempt, j.payload
  FROM lim_k_ids i, pgjq.job(i.id) j
 WHERE j.state = 'ready'
 ORDER BY j.payload->>'n';
SELECT regress.lim_ready_locked('lim_k') AS ready_rows_locked;
COMMIT;
INSERT INTO held SELECT id, token FROM kc;
SELECT regress.lim('lim_k');
-- (a claim that a key limit cut short counts in held_back too)
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_k';
-- every key is at its limit: nothing
SELECT count(*) AS claimed FROM pgjq.claim('lim_k', 10);
SELECT regress.lim('lim_k');
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_k';
-- complete frees the key's slot, and only that key's
SELECT id AS ka, token AS kt FROM kc WHERE fair_key = 'a' \gset
SELECT pgjq.complete(:ka, :kt);
CREATE TEMP TABLE kc2 AS SELECT * FROM pgjq.claim('lim_k', 10);
INSERT INTO held SELECT id, token FROM kc2;
SELECT fair_key, payload, attempt FROM kc2 ORDER BY payload->>'n';
-- fail with a retry frees the key's slot
SELECT id AS kb, token AS kt FROM kc WHERE fair_key = 'b' \gset
SELECT pgjq.fail(:kb, :kt, 'boom');
CREATE TEMP TABLE kc3 AS SELECT * FROM pgjq.claim('lim_k', 10);
INSERT INTO held SELECT id, token FROM kc3;
SELECT fair_key, payload, attempt FROM kc3 ORDER BY payload->>'n';
SELECT count(*) AS claimed FROM pgjq.claim('lim_k', 10);
-- a claim that rolls back gives the key's slot back (snooze frees it first)
SELECT id AS kb, token AS kt FROM kc3 WHERE fair_key = 'b' \gset
SELECT pgjq.snooze(:kb, :kt, '1 hour');
SELECT pgjq.enqueue('lim_k', '{"n": 8}', fair_key => 'b') AS k8 \gset
BEGIN;
SELECT fair_key, payload FROM pgjq.claim('lim_k', 10);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT fair_key, payload FROM pgjq.claim('lim_k', 10);
ROLLBACK TO SAVEPOINT s;
SELECT fair_key, payload FROM pgjq.claim('lim_k', 10);
ROLLBACK;
-- cancel of a running job frees the key's slot at its next heartbeat:
-- until then key c stays full (b's job is claimed, with a 10 ms lease)
SELECT id AS kc_id, token AS kc_t FROM kc WHERE fair_key = 'c' \gset
SELECT pgjq.cancel(:kc_id);
SELECT pgjq.enqueue('lim_k', '{"n": 9}', fair_key => 'c') AS k9 \gset
CREATE TEMP TABLE kc4 AS SELECT * FROM pgjq.claim('lim_k', 10, lease => '10 milliseconds');
SELECT fair_key, payload FROM kc4 ORDER BY payload->>'n';
SELECT pgjq.heartbeat(:kc_id, :kc_t) IS NULL AS heartbeat_null;
INSERT INTO kc4 SELECT * FROM pgjq.claim('lim_k', 10, lease => '10 milliseconds');
SELECT fair_key, payload FROM kc4 ORDER BY payload->>'n';
-- rescue frees the keys' slots
SELECT pg_sleep(0.1);
SELECT pgjq.rescue() >= 2 AS rescued;
SELECT (pgjq.job(id)).state, (pgjq.job(id)).last_error FROM kc4 ORDER BY payload->>'n';
SELECT pgjq.enqueue_many('lim_k', ARRAY['{"n": 10}', '{"n": 11}']::jsonb[], fair_keys => ARRAY['b', 'c']) IS NOT NULL AS enqueued;
CREATE TEMP TABLE kc5 AS SELECT * FROM pgjq.claim('lim_k', 10);
INSERT INTO held SELECT id, token FROM kc5;
SELECT fair_key, payload FROM kc5 ORDER BY payload->>'n';
SELECT regress.lim('lim_k');
-- key_concurrency 2: up to two per key; with concurrency 3 on top, at most
-- three in all
SELECT regress.lim_finish() AS finished;
SELECT pgjq.purge('lim_k') >= 0 AS purged;
SELECT pgjq.alter_queue('lim_k', key_concurrency => 2);
SELECT count(*) FROM pgjq.enqueue_many('lim_k', array_fill('{}'::jsonb, ARRAY[9]),
	fair_keys => ARRAY['a', 'a', 'a', 'a', 'b', 'b', 'b', 'c', 'c']);
CREATE TEMP TABLE kc6 AS SELECT * FROM pgjq.claim('lim_k', 10);
INSERT INTO held SELECT id, token FROM kc6;
SELECT fair_key, count(*) FROM kc6 GROUP BY fair_key ORDER BY fair_key;
SELECT regress.lim_finish() AS finished;
SELECT pgjq.alter_queue('lim_k', concurrency => 3);
CREATE TEMP TABLE kc7 AS SELECT * FROM pgjq.claim('lim_k', 10);
INSERT INTO held SELECT id, token FROM kc7;
SELECT sum(n) AS claimed, max(n) AS most_per_key
  FROM (SELECT fair_key, count(*) AS n FROM kc7 GROUP BY fair_key) k;
SELECT regress.lim('lim_k');
-- both limits, and a rolled-back claim that the key limit cut short (the
-- queue limit let it take 2, key a is full, so it took only c's job): the
-- running jobs still count afterwards
SELECT pgjq.alter_queue('lim_k', concurrency => 5);
SELECT count(*) FROM pgjq.enqueue_many('lim_k', array_fill('{}'::jsonb, ARRAY[2]),
	fair_keys => ARRAY['a', 'c']);
BEGIN;
SELECT fair_key FROM pgjq.claim('lim_k', 10);
ROLLBACK;
SELECT regress.lim('lim_k');
SELECT count(*) FROM pgjq.enqueue_many('lim_k', array_fill('{}'::jsonb, ARRAY[6]),
	fair_keys => ARRAY['d', 'd', 'e', 'e', 'f', 'f']);
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_k', 10) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT regress.lim('lim_k');
SELECT regress.lim_finish() AS finished;
SELECT pgjq.drop_queue('lim_k', force => true);

-- ================================================================== rate

-- burst: up to `burst` claims at once, then nothing until the bucket refills
-- (one token per 2 s)
SELECT pgjq.create_queue('lim_r', rate => 0.5, burst => 3);
SELECT count(*) FROM pgjq.enqueue_many('lim_r', array_fill('{}'::jsonb, ARRAY[20]));
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT count(*) AS claimed_right_after FROM pgjq.claim('lim_r', 10);
SELECT regress.lim('lim_r');
SELECT held_back FROM pgjq.queue_stats WHERE queue = 'lim_r';
-- the rate limits claim starts, not running jobs: completing gives nothing back
SELECT regress.lim_finish() AS finished;
SELECT count(*) AS claimed_after_complete FROM pgjq.claim('lim_r', 10);
-- one token per second, and (burst 1) never more than one
SELECT pgjq.alter_queue('lim_r', rate => 1, burst => 1);
SELECT pg_sleep(1.2);
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed_after_refill FROM c;
SELECT count(*) AS claimed_right_after FROM pgjq.claim('lim_r', 10);
SELECT pg_sleep(2.5);
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed_after_long_pause FROM c;
-- a token the claim did not use (too few jobs) is not spent
SELECT pgjq.purge('lim_r') > 0 AS purged;
SELECT pgjq.alter_queue('lim_r', burst => 3);
SELECT pg_sleep(3.2);
SELECT pgjq.enqueue('lim_r') IS NOT NULL AS enqueued;
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed FROM c;
SELECT count(*) FROM pgjq.enqueue_many('lim_r', array_fill('{}'::jsonb, ARRAY[5]));
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed_with_the_rest FROM c;
-- without burst the bucket holds max(1, ceil(rate)) tokens
SELECT pgjq.create_queue('lim_r2', rate => 2.5);
SELECT count(*) FROM pgjq.enqueue_many('lim_r2', array_fill('{}'::jsonb, ARRAY[10]));
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r2', 10) RETURNING 1)
SELECT count(*) AS claimed FROM c;
-- rate => 0 removes the limit
SELECT pgjq.alter_queue('lim_r', rate => 0);
SELECT rate FROM pgjq.queue_stats WHERE queue = 'lim_r';
SELECT count(*) FROM pgjq.enqueue_many('lim_r', array_fill('{}'::jsonb, ARRAY[5]));
WITH c AS (INSERT INTO held SELECT id, token FROM pgjq.claim('lim_r', 10) RETURNING 1)
SELECT count(*) AS claimed_without_rate FROM c;
SELECT regress.lim_finish() AS finished;
SELECT pgjq.drop_queue('lim_r', force => true);
SELECT pgjq.drop_queue('lim_r2', force => true);

-- ========================================================= waiting claims

SELECT pgjq.create_queue('lim_w');
-- an empty queue: nothing, after about the wait
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited,
	   clock_timestamp() - :'t0'::timestamptz < interval '10 s' AS not_much_longer;
-- a claimable job: at once (well before the wait ends)
SELECT pgjq.enqueue('lim_w', '{"w": 1}') AS w1 \gset
SELECT clock_timestamp() AS t0 \gset
SELECT id = :w1 AS is_w1, token AS wt FROM pgjq.claim('lim_w', wait => '30 s') \gset
SELECT :'is_w1' AS is_w1, clock_timestamp() - :'t0'::timestamptz < interval '15 s' AS at_once;
SELECT pgjq.complete(:w1, :wt);
-- wait => 0 does not wait
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '0');
-- a wait longer than pgjq.max_wait is cut to it
SET pgjq.max_wait = '300ms';
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '1 hour');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '290 ms' AS waited,
	   clock_timestamp() - :'t0'::timestamptz < interval '60 s' AS cut_to_max_wait;
RESET pgjq.max_wait;
-- a paused queue hands out nothing, also to a waiting claim
SELECT pgjq.enqueue('lim_w', '{"w": 2}') AS w2 \gset
SELECT pgjq.pause('lim_w');
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;
SELECT pgjq.resume('lim_w');
-- a queue at its concurrency limit: nothing, after the wait
SELECT pgjq.alter_queue('lim_w', concurrency => 1);
SELECT id AS w2c, token AS w2t FROM pgjq.claim('lim_w') \gset
SELECT pgjq.enqueue('lim_w', '{"w": 3}') AS w3 \gset
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;
SELECT pgjq.complete(:w2c, :w2t);
SELECT payload FROM pgjq.claim('lim_w', wait => '200 milliseconds');
SELECT pgjq.alter_queue('lim_w', concurrency => 0);
-- a queue whose rate holds its ready jobs back: the claim waits for the
-- bucket to refill (a quarter of a second at 4/s), not for the whole wait
SELECT pgjq.alter_queue('lim_w', rate => 4, burst => 1);
SELECT count(*) FROM pgjq.enqueue_many('lim_w', array_fill('{}'::jsonb, ARRAY[2]));
SELECT count(*) FROM (SELECT pgjq.complete(id, token) FROM pgjq.claim('lim_w', 10)) c;
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) FROM (SELECT pgjq.complete(id, token) FROM pgjq.claim('lim_w', 10, wait => '20 s')) c;
SELECT clock_timestamp() - :'t0'::timestamptz < interval '3 s' AS woken_by_refill;
SELECT pgjq.alter_queue('lim_w', rate => 0);
-- inside a transaction block (READ COMMITTED) a claim may wait too
BEGIN;
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('lim_w', wait => '100 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '90 ms' AS waited;
COMMIT;

-- errors
-- REPEATABLE READ or SERIALIZABLE could never see a new job: 25001
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pgjq.claim('lim_w', wait => '1 s');
\echo :SQLSTATE
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT * FROM pgjq.claim(ARRAY['lim_w'], wait => '1 s');
\echo :SQLSTATE
ROLLBACK;
-- (a claim without wait is fine there)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) AS claimed FROM pgjq.claim('lim_w');
ROLLBACK;
SELECT * FROM pgjq.claim('lim_w', wait => '-1 s');
\echo :SQLSTATE
SELECT * FROM pgjq.claim('lim_w', wait => '-1 ms');
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY['lim_w'], wait => '-5 minutes');
\echo :SQLSTATE
SELECT * FROM pgjq.claim('lim_nope', wait => '1 s');
\echo :SQLSTATE

-- ============================================== claims from several queues

SELECT pgjq.create_queue('lim_qa');
SELECT pgjq.create_queue('lim_qb');
SELECT pgjq.create_queue('lim_qc');
SELECT count(*) FROM pgjq.enqueue_many('lim_qa', ARRAY['{"q": "a1"}']::jsonb[]);
SELECT count(*) FROM pgjq.enqueue_many('lim_qb', ARRAY['{"q": "b1"}', '{"q": "b2"}', '{"q": "b3"}']::jsonb[]);
SELECT count(*) FROM pgjq.enqueue_many('lim_qc', ARRAY['{"q": "c1"}', '{"q": "c2"}']::jsonb[]);
-- the first queue first: a batch it fills alone takes nothing from the others
CREATE TEMP TABLE m1 AS SELECT * FROM pgjq.claim(ARRAY['lim_qb', 'lim_qa'], 2);
SELECT payload FROM m1 ORDER BY payload->>'q';
-- in the array's order, each queue giving what it has
CREATE TEMP TABLE m2 AS SELECT * FROM pgjq.claim(ARRAY['lim_qa', 'lim_qb', 'lim_qc'], 3);
SELECT payload FROM m2 ORDER BY payload->>'q';
-- one token for the whole call, a new one for each call
SELECT count(DISTINCT token) AS tokens_per_call FROM m2;
SELECT (SELECT min(token) FROM m2) > (SELECT max(token) FROM m1) AS token_grew;
SELECT pgjq.complete(array_agg(id), array_agg(token)) FROM (SELECT * FROM m1 UNION ALL SELECT * FROM m2) m;
-- a paused queue and a queue at its limit are skipped; the next one gives
SELECT count(*) FROM pgjq.enqueue_many('lim_qa', ARRAY['{"q": "a2"}']::jsonb[]);
SELECT count(*) FROM pgjq.enqueue_many('lim_qb', ARRAY['{"q": "b4"}']::jsonb[]);
SELECT pgjq.pause('lim_qa');
SELECT pgjq.alter_queue('lim_qb', concurrency => 1);
SELECT id AS mb, token AS mbt FROM pgjq.claim('lim_qb') \gset
CREATE TEMP TABLE m3 AS SELECT * FROM pgjq.claim(ARRAY['lim_qa', 'lim_qb', 'lim_qc'], 5);
SELECT payload FROM m3 ORDER BY payload->>'q';
SELECT pgjq.complete(array_agg(id), array_agg(token)) FROM m3;
SELECT pgjq.complete(:mb, :mbt);
SELECT pgjq.resume('lim_qa');
-- the same queue twice is harmless
SELECT payload FROM pgjq.claim(ARRAY['lim_qa', 'lim_qa'], 5) ORDER BY payload->>'q';
-- waiting on several empty queues: nothing, after about the wait
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim(ARRAY['lim_qa', 'lim_qc'], wait => '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;

-- errors: empty, NULL, NULL element, too many queues, unknown queue, bad name
SELECT * FROM pgjq.claim(ARRAY[]::text[]);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(NULL::text[]);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY['lim_qa', NULL]);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(array_fill('lim_qa'::text, ARRAY[33]));
\echo :SQLSTATE
SELECT count(*) AS claimed_from_32 FROM pgjq.claim(array_fill('lim_qa'::text, ARRAY[32]));
SELECT * FROM pgjq.claim(ARRAY['lim_qa', 'lim_nope']);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY['lim_nope', 'lim_qa'], wait => '10 s');
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY['lim_qa', '']);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY[['lim_qa', 'lim_qb'], ['lim_qc', 'lim_qa']]);
\echo :SQLSTATE
SELECT * FROM pgjq.claim(ARRAY['lim_qa'], batch => 0);
\echo :SQLSTATE

-- ================================================================= await

-- a queue with a ready job: at once
SELECT pgjq.enqueue('lim_qc', '{"q": "c3"}') IS NOT NULL AS enqueued;
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qa', 'lim_qc'], '30 s');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '15 s' AS at_once;
SELECT count(*) FROM (SELECT pgjq.complete(id, token) FROM pgjq.claim(ARRAY['lim_qc'], 10)) c;
-- empty queues: after about the wait
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qa', 'lim_qc'], '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;
-- also inside a transaction block
BEGIN;
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qa'], '100 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '90 ms' AS waited;
COMMIT;
-- a paused queue's ready job is not claimable, so it does not end the wait
-- (else a worker looping on await() and claim() would spin)
SELECT pgjq.enqueue('lim_qa', '{"q": "a3"}') IS NOT NULL AS enqueued;
SELECT pgjq.pause('lim_qa');
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qa'], '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;
SELECT pgjq.resume('lim_qa');
-- nor does the ready job of a queue at its concurrency limit; once a slot
-- is free it does, at once
SELECT count(*) FROM pgjq.enqueue_many('lim_qb', ARRAY['{"q": "b5"}', '{"q": "b6"}']::jsonb[]);
SELECT id AS mb, token AS mbt FROM pgjq.claim('lim_qb') \gset
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qb'], '200 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '190 ms' AS waited;
SELECT pgjq.complete(:mb, :mbt);
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['lim_qb'], '30 s');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '15 s' AS at_once;
-- errors
CALL pgjq.await(ARRAY['lim_qa'], NULL);
\echo :SQLSTATE
CALL pgjq.await(ARRAY['lim_qa'], '-1 s');
\echo :SQLSTATE
CALL pgjq.await(ARRAY[]::text[], '1 s');
\echo :SQLSTATE
CALL pgjq.await(NULL, '1 s');
\echo :SQLSTATE
CALL pgjq.await(ARRAY['lim_nope'], '1 s');
\echo :SQLSTATE
CALL pgjq.await(array_fill('lim_qa'::text, ARRAY[33]), '1 s');
\echo :SQLSTATE

SELECT pgjq.drop_queue('lim_qa', force => true);
SELECT pgjq.drop_queue('lim_qb', force => true);
SELECT pgjq.drop_queue('lim_qc', force => true);
SELECT pgjq.drop_queue('lim_w', force => true);

-- nothing left behind
SELECT count(*) AS lim_queues_left FROM pgjq.list_queues() WHERE queue LIKE 'lim\_%';
DROP FUNCTION regress.lim(text);
DROP FUNCTION regress.lim_ready_locked(text);
DROP FUNCTION regress.lim_finish();
DROP EXTENSION pgrowlocks;
