--
-- verify(): no rows when shared memory and the tables agree; one row per
-- disagreement, shown here by breaking each invariant behind pgjq's back
-- (as superuser) and mending it again.
--
\set VERBOSITY terse

-- the breakages below are made in pgjq.job, so these two queues keep their
-- jobs there (the table engine); ring.sql breaks the ring's state
SET pgjq.engine = 'table';
SELECT pgjq.create_queue('qv', concurrency => 5);
SELECT pgjq.create_queue('qvk', key_concurrency => 2);
RESET pgjq.engine;
SELECT count(*) FROM pgjq.enqueue_many('qv', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) FROM pgjq.enqueue_many('qvk', array_fill('{}'::jsonb, ARRAY[4]), fair_keys => '{a,a,b,b}');
CREATE TEMP TABLE run AS SELECT * FROM pgjq.claim('qv', 2);
CREATE TEMP TABLE runk AS SELECT * FROM pgjq.claim('qvk', 3);
SELECT pgjq.complete(id, token) FROM run ORDER BY id LIMIT 1;
SELECT * FROM pgjq.verify();

-- a running job without a lease
UPDATE pgjq.job SET lease_until = NULL WHERE id = (SELECT max(id) FROM run);
SELECT area, regexp_replace(object, '\d+', 'N') AS object, expected, found FROM pgjq.verify();
UPDATE pgjq.job SET lease_until = now() + interval '1 hour' WHERE id = (SELECT max(id) FROM run);

-- a running job turned ready behind the counters' back: the queue's count,
-- and for a key-limited queue the key's count, disagree with the table
UPDATE pgjq.job SET state = 'r', lease_until = NULL WHERE id = (SELECT max(id) FROM run);
SELECT area, regexp_replace(object, '\d+', 'N') AS object, expected, found FROM pgjq.verify();
UPDATE pgjq.job SET state = 'a', lease_until = now() + interval '1 hour' WHERE id = (SELECT max(id) FROM run);
UPDATE pgjq.job SET state = 'r', lease_until = NULL
 WHERE id = (SELECT min(id) FROM runk WHERE fair_key = 'a');
SELECT area, regexp_replace(object, '\d+', 'N') AS object, expected, found FROM pgjq.verify() ORDER BY object;
UPDATE pgjq.job SET state = 'a', lease_until = now() + interval '1 hour'
 WHERE id = (SELECT min(id) FROM runk WHERE fair_key = 'a');

-- a sequence behind the values in use
SELECT last_value AS token_last FROM pgjq.token_seq \gset
SELECT setval('pgjq.token_seq', 1) IS NOT NULL AS set;
SELECT area, object, expected ~ '^at least \d+$' AS expected_ok, found FROM pgjq.verify();
SELECT setval('pgjq.token_seq', :token_last) IS NOT NULL AS set;

-- a job both unfinished and completed
INSERT INTO pgjq.job_done (queue_id, finished_at, min_id, max_id, ids, attempts, enqueued_at)
	SELECT queue_id, now(), id, id, ARRAY[id], ARRAY[1], ARRAY[now()]
	  FROM pgjq.job WHERE id = (SELECT max(id) FROM run);
SELECT area, regexp_replace(object, '\d+', 'N') AS object, expected, found FROM pgjq.verify();
DELETE FROM pgjq.job_done WHERE ids = ARRAY[(SELECT max(id) FROM run)];

-- a history partition missing from the registry
CREATE TEMP TABLE hp AS SELECT * FROM pgjq.history_partition;
DELETE FROM pgjq.history_partition;
SELECT area, substring(object FROM '^job_[a-z]+') AS parent, expected, found, count(*) > 0 AS some
  FROM pgjq.verify() GROUP BY 1, 2, 3, 4 ORDER BY 2;
INSERT INTO pgjq.history_partition SELECT * FROM hp;

-- healthy again
SELECT * FROM pgjq.verify();

-- for pgjq_admin only
SET ROLE pgjq_worker;
SELECT * FROM pgjq.verify();
RESET ROLE;

SELECT pgjq.drop_queue(q, force => true) FROM unnest(ARRAY['qv', 'qvk']) q;
