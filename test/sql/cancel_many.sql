--
-- cancel_many: cancel_many(ids bigint[]) and cancel_key(queue, fair_key): each
-- job as cancel(id) does (ready and waiting ones end cancelled, running
-- ones are asked to stop), and the count of those changed.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qc', backoff_base => '1 hour');
-- keys a: 3 ready (one of them keyed), 1 running, 1 delayed; b: 2 ready; none: 1
SELECT count(*) FROM pgjq.enqueue_many('qc', array_fill('{}'::jsonb, ARRAY[4]),
                                       fair_keys => ARRAY['a', 'a', 'a', 'a']);
SELECT pgjq.enqueue('qc', '{}', fair_key => 'a', dedup_key => 'ka') AS keyed \gset
SELECT pgjq.enqueue('qc', '{}', fair_key => 'a', delay => '1 hour') AS delayed \gset
SELECT count(*) FROM pgjq.enqueue_many('qc', array_fill('{}'::jsonb, ARRAY[2]),
                                       fair_keys => ARRAY['b', 'b']);
SELECT pgjq.enqueue('qc', '{}') AS nokey \gset
SELECT id AS running, token AS running_tok FROM pgjq.claim('qc', 1) \gset

-- by key: the ready, keyed and delayed jobs of a end, the running one is asked
SELECT pgjq.cancel_key('qc', 'a') AS cancelled;
SELECT j.state, count(*) FROM pgjq.job_history h, pgjq.job(h.id) j
 WHERE h.queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'qc') GROUP BY j.state;
SELECT state, cancel_requested FROM pgjq.job(:running);
SELECT pgjq.complete(:running, :running_tok) AS completed_stale;
SELECT state FROM pgjq.job(:running);
-- the key is free again; nothing of a is left
SELECT pgjq.enqueue('qc', '{}', dedup_key => 'ka') <> :keyed AS new_job;
SELECT pgjq.cancel_key('qc', 'a') AS cancelled_again, pgjq.cancel_key('qc', 'a') AS nothing_left;
-- NULL: the jobs without a key
SELECT pgjq.cancel_key('qc', NULL) AS cancelled_nokey;
SELECT state FROM pgjq.job(:nokey);

-- by ids: duplicates and unknown ids count once or not at all
SELECT min(id) AS c1 FROM pgjq.enqueue_many('qc', array_fill('{}'::jsonb, ARRAY[2]), fair_keys => ARRAY['c', 'c']) id \gset
SELECT pgjq.cancel_many(ARRAY(SELECT h.id FROM pgjq.job_history h WHERE false)) AS none;
SELECT pgjq.cancel_many(ARRAY[:c1, :c1, 999999999]::bigint[]) AS cancelled_ids;
SELECT state FROM pgjq.job(:c1);

-- bad input
SELECT pgjq.cancel_many(ARRAY[1, NULL]::bigint[]);
\echo :SQLSTATE
SELECT pgjq.cancel_many(NULL::bigint[]) IS NULL AS strict;
SELECT pgjq.cancel_key('nope', 'a');
\echo :SQLSTATE
SELECT pgjq.cancel_key(NULL, 'a');
\echo :SQLSTATE

SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('qc', force => true);
