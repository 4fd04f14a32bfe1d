--
-- enqueue: enqueue() and enqueue_many() with every option; dedup_key.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qe', max_attempts => 7);
SELECT pgjq.create_queue('qe_other');

-- the simplest call: an empty object payload, ready at once, queue defaults
SELECT pgjq.enqueue('qe') AS id1 \gset
SELECT queue, state, attempt, max_attempts, priority, fair_key, dedup_key, payload,
       run_at = enqueued_at AS due_at_enqueue, lease_until, finished_at, worker, last_error,
       cancel_requested
  FROM pgjq.job(:id1);
SELECT enqueued_at BETWEEN now() - interval '1 minute' AND now() AS enqueued_at_recent
  FROM pgjq.job(:id1);

-- every option, named
SELECT pgjq.enqueue(queue => 'qe', payload => '{"task": "resize", "size": [1, 2]}',
                    priority => -3::smallint, fair_key => 'tenant-1', dedup_key => 'img-42',
                    max_attempts => 2) AS id2 \gset
SELECT :id2 > :id1 AS ids_ascend;
SELECT state, attempt, max_attempts, priority, fair_key, dedup_key, payload FROM pgjq.job(:id2);
-- positional
SELECT pgjq.enqueue('qe', '[1, 2, 3]', NULL, NULL, 4::smallint, 'tenant-2', NULL, 1) AS id3 \gset
SELECT state, max_attempts, priority, fair_key, payload FROM pgjq.job(:id3);
-- a plain integer literal for priority (what every caller writes) works too
SELECT pgjq.enqueue('qe', priority => 5) AS id_int_prio \gset
SELECT priority FROM pgjq.job(:id_int_prio);
-- max_attempts has the bounds of the queue setting
SELECT pgjq.enqueue('qe', max_attempts => 10000) > 0 AS enqueued;
SELECT pgjq.enqueue('qe', max_attempts => 0);
\echo :SQLSTATE
SELECT pgjq.enqueue('qe', max_attempts => 10001);
\echo :SQLSTATE
-- priority may use the whole smallint range
SELECT pgjq.enqueue('qe', priority => (-32768)::smallint) > 0 AS enqueued;
SELECT pgjq.enqueue('qe', priority => 32767::smallint) > 0 AS enqueued;
-- an empty fair_key is the same group as NULL, reported as NULL
SELECT pgjq.enqueue('qe', fair_key => '') AS id_empty_key \gset
SELECT fair_key IS NULL AS fair_key_is_null FROM pgjq.job(:id_empty_key);
-- JSON of any kind is a payload, stored as given
SELECT pgjq.enqueue('qe', payload => '"just a string"') AS id_str \gset
SELECT payload FROM pgjq.job(:id_str);
SELECT regress.counts('qe');

-- delay: scheduled until now + delay
SELECT pgjq.enqueue('qe', delay => '1 hour') AS id_delay \gset
SELECT state, run_at = enqueued_at + interval '1 hour' AS run_at_exact FROM pgjq.job(:id_delay);
-- a zero delay is ready at once
SELECT pgjq.enqueue('qe', delay => '0') AS id_zero \gset
SELECT state, run_at = enqueued_at AS due_now FROM pgjq.job(:id_zero);
-- run_at in the future: scheduled for exactly that time
SELECT now() + interval '2 days' AS in_2_days \gset
SELECT pgjq.enqueue('qe', run_at => :'in_2_days') AS id_run_at \gset
SELECT state, run_at = :'in_2_days' AS run_at_exact FROM pgjq.job(:id_run_at);
-- run_at in the past: ready at once
SELECT pgjq.enqueue('qe', run_at => now() - interval '1 day') AS id_past \gset
SELECT state, run_at <= now() AS due FROM pgjq.job(:id_past);
-- at most 3650 days ahead, either way
SELECT pgjq.enqueue('qe', delay => '3650 days') > 0 AS enqueued;
SELECT pgjq.enqueue('qe', run_at => now() + interval '3650 days') > 0 AS enqueued;
SELECT regress.counts('qe');
SELECT pgjq.enqueue('qe', delay => '3650 days 1 second');
\echo :SQLSTATE
SELECT pgjq.enqueue('qe', run_at => now() + interval '3650 days 1 second');
\echo :SQLSTATE
SELECT pgjq.enqueue('qe', delay => '-1 second');
\echo :SQLSTATE
-- delay and run_at together: 22023
SELECT pgjq.enqueue('qe', delay => '1 minute', run_at => now() + interval '1 minute');
\echo :SQLSTATE
SELECT pgjq.enqueue('qe', delay => '0', run_at => now());
\echo :SQLSTATE
SELECT count(*) FROM pgjq.enqueue_many('qe', ARRAY['{}'::jsonb], delay => '1 minute',
                                       run_at => now() + interval '1 minute');
\echo :SQLSTATE
-- none of the rejected calls enqueued anything
SELECT regress.counts('qe');

-- enqueue_many: ids in input order, one per payload (pgjq.job() runs in a
-- later statement: a function in the same statement would not see the rows)
CREATE TEMP TABLE many (id bigint, ord bigint);
INSERT INTO many
	SELECT * FROM pgjq.enqueue_many('qe_other', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[])
	              WITH ORDINALITY;
SELECT m.ord, j.payload, j.state, j.priority, j.fair_key, j.max_attempts
  FROM many m CROSS JOIN LATERAL pgjq.job(m.id) j ORDER BY m.ord;
SELECT count(*) AS out_of_order
  FROM (SELECT id, lag(id) OVER (ORDER BY ord) AS prev FROM many) s WHERE id <= prev;
-- with parallel fair_keys and dedup_keys, and options shared by all
TRUNCATE many;
INSERT INTO many
	SELECT * FROM pgjq.enqueue_many('qe_other', ARRAY['{"n": 4}', '{"n": 5}', '{"n": 6}']::jsonb[],
	                                delay => '5 minutes', priority => 2::smallint,
	                                fair_keys => ARRAY['a', NULL, 'b'],
	                                dedup_keys => ARRAY['d4', 'd5', NULL])
	              WITH ORDINALITY;
SELECT m.ord, j.payload, j.state, j.priority, j.fair_key, j.dedup_key,
       j.run_at = j.enqueued_at + interval '5 minutes' AS delayed_5_min
  FROM many m CROSS JOIN LATERAL pgjq.job(m.id) j ORDER BY m.ord;
SELECT now() + interval '1 hour' AS in_1_hour \gset
TRUNCATE many;
INSERT INTO many
	SELECT * FROM pgjq.enqueue_many('qe_other', ARRAY['{}', '{}']::jsonb[], run_at => :'in_1_hour')
	              WITH ORDINALITY;
SELECT m.ord, j.state, j.run_at = :'in_1_hour' AS run_at_exact
  FROM many m CROSS JOIN LATERAL pgjq.job(m.id) j ORDER BY m.ord;
-- an empty array enqueues nothing and returns no rows
SELECT count(*) FROM pgjq.enqueue_many('qe_other', '{}'::jsonb[]);
SELECT regress.counts('qe_other');

-- 10,000 jobs in one call: 10,000 distinct ascending ids, each in its input position
SELECT pgjq.create_queue('qe_big');
CREATE TEMP TABLE big AS
	SELECT t.id, t.ord
	  FROM pgjq.enqueue_many('qe_big',
	                         (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i)
	                            FROM generate_series(1, 10000) i))
	       WITH ORDINALITY AS t(id, ord);
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids, min(ord) AS first, max(ord) AS last
  FROM big;
SELECT count(*) AS out_of_order
  FROM (SELECT id, lag(id) OVER (ORDER BY ord) AS prev FROM big) s
 WHERE id <= prev;
SELECT count(*) AS misplaced
  FROM big CROSS JOIN LATERAL pgjq.job(big.id) j
 WHERE (j.payload->>'i')::bigint <> big.ord OR j.queue <> 'qe_big' OR j.state <> 'ready';
SELECT regress.counts('qe_big');
SELECT pgjq.drop_queue('qe_big');

-- dedup_key across calls: the duplicate returns the existing id and creates nothing
SELECT pgjq.create_queue('qe_dedup');
SELECT pgjq.enqueue('qe_dedup', '{"v": 1}', dedup_key => 'k1') AS k1 \gset
SELECT pgjq.enqueue('qe_dedup', '{"v": 2}', dedup_key => 'k1') = :k1 AS same_id;
SELECT pgjq.enqueue('qe_dedup', '{"v": 3}', dedup_key => 'k1', delay => '1 hour',
                    priority => 9::smallint) = :k1 AS same_id;
-- the existing job is unchanged (first payload, still ready, priority 0)
SELECT state, priority, payload FROM pgjq.job(:k1);
SELECT regress.counts('qe_dedup');
-- keys are per queue, and case sensitive
SELECT pgjq.enqueue('qe_other', dedup_key => 'k1') <> :k1 AS other_queue_new_job;
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'K1') <> :k1 AS other_case_new_job;
-- enqueue_many against an existing job, and duplicates within one call:
-- k1 is the existing job, both k2 positions get the one new k2 job
TRUNCATE many;
INSERT INTO many
	SELECT * FROM pgjq.enqueue_many('qe_dedup',
	                                ARRAY['{"v": 4}', '{"v": 5}', '{"v": 6}', '{"v": 7}', '{"v": 8}']::jsonb[],
	                                dedup_keys => ARRAY['k1', 'k2', 'k2', NULL, 'k3'])
	              WITH ORDINALITY;
SELECT m.ord, m.id = :k1 AS is_k1, count(*) OVER (PARTITION BY m.id) AS positions_sharing_id,
       j.dedup_key, j.payload
  FROM many m CROSS JOIN LATERAL pgjq.job(m.id) j ORDER BY m.ord;
SELECT id AS k2 FROM many WHERE ord = 2 \gset
SELECT id = :k2 AS same_k2
  FROM pgjq.enqueue_many('qe_dedup', ARRAY['{"v": 9}']::jsonb[], dedup_keys => ARRAY['k2']) AS t(id);
SELECT regress.counts('qe_dedup');
-- NULL dedup keys never collide
SELECT count(DISTINCT id) AS distinct_ids
  FROM pgjq.enqueue_many('qe_dedup', ARRAY['{}', '{}', '{}']::jsonb[],
                         dedup_keys => ARRAY[NULL, NULL, NULL]::text[]) AS t(id);
SELECT regress.counts('qe_dedup');

-- the key stays taken while the job is scheduled and while it runs ...
SELECT pgjq.purge('qe_dedup');
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'later', delay => '1 hour') AS later \gset
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'later') = :later AS same_id_while_scheduled;
SELECT pgjq.purge('qe_dedup');
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'run') AS run \gset
SELECT id AS run_claimed, token AS run_token FROM pgjq.claim('qe_dedup') \gset
SELECT :run_claimed = :run AS claimed_it;
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'run') = :run AS same_id_while_running;
-- ... and is free again once the job finished: completed ...
SELECT pgjq.complete(:run, :run_token);
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'run') AS run2 \gset
SELECT :run2 <> :run AS new_job_after_complete;
SELECT state FROM pgjq.job(:run2);
-- ... cancelled ...
SELECT pgjq.cancel(:run2);
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'run', max_attempts => 1) AS run3 \gset
SELECT :run3 NOT IN (:run, :run2) AS new_job_after_cancel;
-- ... or dead
SELECT id AS run3_claimed, token AS run3_token FROM pgjq.claim('qe_dedup') \gset
SELECT :run3_claimed = :run3 AS claimed_it;
SELECT pgjq.fail(:run3, :run3_token, 'fatal');
SELECT state FROM pgjq.job(:run3);
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'run') AS run4 \gset
SELECT :run4 NOT IN (:run, :run2, :run3) AS new_job_after_dead;
SELECT regress.counts('qe_dedup');

-- enqueue is transactional: a rolled-back enqueue leaves nothing, and its
-- dedup_key is free
BEGIN;
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'rolled-back') AS rb \gset
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM pgjq.job(:rb);
SELECT pgjq.enqueue('qe_dedup', dedup_key => 'rolled-back') <> :rb AS new_id;

-- unknown queue
SELECT pgjq.enqueue('qe_nope');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.enqueue_many('qe_nope', ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.enqueue_many('qe_nope', '{}'::jsonb[]);
\echo :SQLSTATE

-- clean up
SELECT pgjq.drop_queue('qe', force => true);
SELECT pgjq.drop_queue('qe_other', force => true);
SELECT pgjq.drop_queue('qe_dedup', force => true);
