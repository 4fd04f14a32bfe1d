--
-- verify(): no rows when shared memory and the tables agree; one row per
-- disagreement, shown here by breaking each invariant behind pgjq's back
-- (as superuser) and mending it again.
--
\set VERBOSITY terse

-- the breakages below are made in pgjq.job and the history (ring.sql
-- breaks the ring's state); qv holds a delayed job and a job with a
-- dedup_key (its anchor is a pgjq.job row)
SELECT pgjq.create_queue('qv', concurrency => 5);
SELECT pgjq.create_queue('qvk', key_concurrency => 2);
SELECT count(*) FROM pgjq.enqueue_many('qv', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) FROM pgjq.enqueue_many('qvk', array_fill('{}'::jsonb, ARRAY[4]), fair_keys => '{a,a,b,b}');
SELECT pgjq.enqueue('qv', '{}', delay => '1 hour') AS delayed \gset
SELECT pgjq.enqueue('qv', '{}', dedup_key => 'k') AS keyed \gset
CREATE TEMP TABLE run AS SELECT * FROM pgjq.claim('qv', 2);
CREATE TEMP TABLE runk AS SELECT * FROM pgjq.claim('qvk', 3);
SELECT pgjq.complete(id, token) FROM run ORDER BY id LIMIT 1;
SELECT * FROM pgjq.verify();

-- a dedup anchor that lost its key
UPDATE pgjq.job SET dedup_key = NULL WHERE id = :keyed;
SELECT area, regexp_replace(object, '\d+', 'N', 'g') AS object, expected, found
  FROM pgjq.verify() ORDER BY 1, 2;
UPDATE pgjq.job SET dedup_key = 'k' WHERE id = :keyed;

-- an anchor whose job is not in the ring
UPDATE pgjq.job SET id = -id WHERE id = :keyed;
SELECT area, regexp_replace(object, '\d+', 'N', 'g') AS object,
       regexp_replace(expected, '\d+', 'N', 'g') AS expected, regexp_replace(found, '\d+', 'N', 'g') AS found
  FROM pgjq.verify() ORDER BY 1, 2;
UPDATE pgjq.job SET id = -id WHERE id = -:keyed;

-- a sequence behind the tokens in use (the ring's claims hold them)
SELECT last_value AS token_last FROM pgjq.token_seq \gset
SELECT setval('pgjq.token_seq', 1) IS NOT NULL AS set;
SELECT area, object, expected ~ '^at least \d+$' AS expected_ok, found FROM pgjq.verify();
SELECT setval('pgjq.token_seq', :token_last) IS NOT NULL AS set;

-- a job both unfinished (delayed) and completed
INSERT INTO pgjq.job_done (queue_id, finished_at, min_id, max_id, ids, attempts, enqueued_at)
	SELECT queue_id, now(), id, id, ARRAY[id], ARRAY[1], ARRAY[now()]
	  FROM pgjq.job WHERE id = :delayed;
SELECT area, regexp_replace(object, '\d+', 'N') AS object, expected, found FROM pgjq.verify();
DELETE FROM pgjq.job_done WHERE ids = ARRAY[:delayed::bigint];

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
