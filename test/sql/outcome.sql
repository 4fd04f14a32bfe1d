--
-- outcome: complete, fail (retry with backoff, retry_in, dead, stale),
-- heartbeat, snooze, cancel, retry_dead.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qo', backoff_base => '10 seconds', backoff_max => '25 seconds',
                         max_attempts => 3);

---------------------------------------------------------------- complete
SELECT pgjq.enqueue('qo', '{"p": 1}') AS c1 \gset
SELECT token AS c1_token FROM pgjq.claim('qo') \gset
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.complete(:c1, :c1_token);
SELECT clock_timestamp() AS t1 \gset
SELECT state, attempt, finished_at BETWEEN :'t0' AND :'t1' AS finished_during_call,
       lease_until, run_at
  FROM pgjq.job(:c1);
-- a completed job never comes back: a second complete, fail, heartbeat,
-- snooze or cancel changes nothing
SELECT pgjq.complete(:c1, :c1_token) AS complete_again;
SELECT pgjq.fail(:c1, :c1_token) AS fail_after_complete;
SELECT pgjq.heartbeat(:c1, :c1_token) IS NULL AS heartbeat_is_null;
SELECT pgjq.snooze(:c1, :c1_token, '1 second') AS snooze_after_complete;
SELECT pgjq.cancel(:c1) AS cancel_after_complete;
SELECT state FROM pgjq.job(:c1);
SELECT count(*) AS claimed FROM pgjq.claim('qo');
-- stale tokens: false, nothing changes
SELECT pgjq.enqueue('qo') AS c2 \gset
SELECT token AS c2_token FROM pgjq.claim('qo') \gset
SELECT pgjq.complete(:c2, :c2_token + 1) AS wrong_token;
SELECT pgjq.complete(:c2, 0) AS zero_token;
SELECT pgjq.complete(-1, :c2_token) AS unknown_id;
SELECT state FROM pgjq.job(:c2);
SELECT pgjq.complete(:c2, :c2_token);

-- complete(ids[], tokens[]) returns how many it completed; stale pairs are skipped
SELECT count(*) FROM pgjq.enqueue_many('qo', array_fill('{}'::jsonb, ARRAY[5]));
CREATE TEMP TABLE b AS SELECT * FROM pgjq.claim('qo', 5);
SELECT pgjq.complete((SELECT array_agg(id ORDER BY id) FROM b WHERE id < (SELECT max(id) FROM b)),
                     (SELECT array_agg(token ORDER BY id) FROM b WHERE id < (SELECT max(id) FROM b)))
       AS completed;
-- one fresh pair among stale ones
SELECT pgjq.complete((SELECT array_agg(id ORDER BY id) FROM b),
                     (SELECT array_agg(token ORDER BY id) FROM b)) AS completed;
SELECT regress.counts('qo');
-- one call may complete jobs of several queues
SELECT pgjq.create_queue('qo_other');
SELECT pgjq.enqueue('qo') AS m1 \gset
SELECT pgjq.enqueue('qo_other') AS m2 \gset
SELECT token AS m1_token FROM pgjq.claim('qo') \gset
SELECT token AS m2_token FROM pgjq.claim('qo_other') \gset
SELECT pgjq.complete(ARRAY[:m1, :m2], ARRAY[:m1_token, :m2_token]) AS completed;
SELECT queue, state, attempt FROM pgjq.job(:m1) UNION ALL SELECT queue, state, attempt FROM pgjq.job(:m2);
SELECT regress.counts('qo_other');
SELECT pgjq.drop_queue('qo_other');
-- a pair given twice counts once
SELECT pgjq.enqueue('qo') AS c3 \gset
SELECT token AS c3_token FROM pgjq.claim('qo') \gset
SELECT pgjq.complete(ARRAY[:c3, :c3], ARRAY[:c3_token, :c3_token]) AS completed;
-- empty arrays: nothing to do
SELECT pgjq.complete('{}'::bigint[], '{}'::bigint[]) AS completed;
-- mismatched lengths, NULL elements or NULL arrays are errors that change nothing
SELECT pgjq.enqueue('qo') AS c4 \gset
SELECT token AS c4_token FROM pgjq.claim('qo') \gset
SELECT pgjq.complete(ARRAY[:c4], '{}'::bigint[]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:c4], ARRAY[:c4_token, :c4_token]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:c4, NULL], ARRAY[:c4_token, 1]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:c4, 1], ARRAY[:c4_token, NULL]);
\echo :SQLSTATE
SELECT pgjq.complete(NULL::bigint[], ARRAY[:c4_token]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:c4], NULL::bigint[]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[[:c4]], ARRAY[[:c4_token]]);
\echo :SQLSTATE
SELECT state FROM pgjq.job(:c4);
SELECT pgjq.complete(ARRAY[:c4], ARRAY[:c4_token]) AS completed;

---------------------------------------------------------------- fail
-- attempt 1 fails: retry after backoff_base (10 s), jittered down by at most 25%
SELECT pgjq.enqueue('qo', '{"p": "f1"}') AS f1 \gset
SELECT token AS f1_token FROM pgjq.claim('qo') \gset
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.fail(:f1, :f1_token, 'connection refused');
SELECT clock_timestamp() AS t1 \gset
SELECT state, attempt, last_error, lease_until,
       run_at BETWEEN :'t0'::timestamptz + interval '7.5 seconds' AND :'t1'::timestamptz + interval '10 seconds'
         AS backoff_in_bounds
  FROM pgjq.job(:f1);
-- the old token is stale now
SELECT pgjq.fail(:f1, :f1_token, 'again') AS fail_again;
SELECT pgjq.complete(:f1, :f1_token) AS complete_after_fail;
-- attempt 2 fails: 2 x base = 20 s (earlier attempts retried at once with retry_in => 0)
SELECT pgjq.enqueue('qo', '{"p": "f2"}') AS f2 \gset
SELECT token AS f2_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f2, :f2_token, 'first', retry_in => '0');
SELECT state, attempt, run_at <= now() AS due FROM pgjq.job(:f2);
SELECT pgjq.promote() AS promoted;
SELECT id = :f2 AS is_f2, attempt, token AS f2_token FROM pgjq.claim('qo') \gset
SELECT :'is_f2' AS is_f2, :attempt AS attempt;
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.fail(:f2, :f2_token, 'second');
SELECT clock_timestamp() AS t1 \gset
SELECT state, attempt, last_error,
       run_at BETWEEN :'t0'::timestamptz + interval '15 seconds' AND :'t1'::timestamptz + interval '20 seconds'
         AS backoff_in_bounds
  FROM pgjq.job(:f2);
-- attempt 3 of a job allowed 5: 4 x base = 40 s, capped at backoff_max (25 s)
SELECT pgjq.enqueue('qo', '{"p": "f3"}', max_attempts => 5) AS f3 \gset
SELECT token AS f3_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f3, :f3_token, retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT token AS f3_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f3, :f3_token, retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT token AS f3_token, attempt FROM pgjq.claim('qo') \gset
SELECT :attempt AS attempt;
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.fail(:f3, :f3_token, 'third');
SELECT clock_timestamp() AS t1 \gset
SELECT state, attempt,
       run_at BETWEEN :'t0'::timestamptz + interval '18.75 seconds' AND :'t1'::timestamptz + interval '25 seconds'
         AS backoff_capped
  FROM pgjq.job(:f3);
-- explicit retry_in: exactly that long, no jitter
SELECT pgjq.enqueue('qo') AS f4 \gset
SELECT token AS f4_token FROM pgjq.claim('qo') \gset
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.fail(:f4, :f4_token, 'rate limited', retry_in => '1 minute');
SELECT clock_timestamp() AS t1 \gset
SELECT state, last_error,
       run_at BETWEEN :'t0'::timestamptz + interval '1 minute' AND :'t1'::timestamptz + interval '1 minute'
         AS retry_in_exact
  FROM pgjq.job(:f4);
-- retry_in must be within [0, 3650 days]; a rejected call changes nothing
SELECT pgjq.enqueue('qo') AS f5 \gset
SELECT token AS f5_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f5, :f5_token, 'x', retry_in => '-1 second');
\echo :SQLSTATE
SELECT pgjq.fail(:f5, :f5_token, 'x', retry_in => '3651 days');
\echo :SQLSTATE
SELECT state, attempt, last_error FROM pgjq.job(:f5);
-- the last attempt fails: dead, the payload kept for retry_dead
SELECT pgjq.fail(:f5, :f5_token, 'first', retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT token AS f5_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f5, :f5_token, 'second', retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT token AS f5_token, attempt FROM pgjq.claim('qo') \gset
SELECT :attempt AS attempt;
SELECT pgjq.fail(:f5, :f5_token, 'third and last', retry_in => '0') AS outcome;
SELECT state, attempt, max_attempts, last_error, payload, finished_at IS NOT NULL AS finished
  FROM pgjq.job(:f5);
SELECT pgjq.fail(:f5, :f5_token) AS fail_dead_job;
-- a job allowed one attempt dies at its first failure, whatever retry_in says
SELECT pgjq.enqueue('qo', max_attempts => 1) AS f6 \gset
SELECT token AS f6_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f6, :f6_token, 'boom', retry_in => '1 second') AS outcome;
SELECT state, attempt, last_error FROM pgjq.job(:f6);
-- fail without an error text
SELECT pgjq.enqueue('qo', max_attempts => 1) AS f7 \gset
SELECT token AS f7_token FROM pgjq.claim('qo') \gset
SELECT pgjq.fail(:f7, :f7_token) AS outcome;
SELECT state, last_error FROM pgjq.job(:f7);
-- stale: wrong token, unknown id
SELECT pgjq.fail(-1, 1) AS unknown_id;
SELECT regress.counts('qo');

---------------------------------------------------------------- heartbeat
SELECT pgjq.enqueue('qo') AS h1 \gset
SELECT token AS h1_token, lease_until AS h1_lease FROM pgjq.claim('qo') \gset
SELECT pg_sleep(0.01);
-- the lease is extended by the queue's lease (30 s) from now
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.heartbeat(:h1, :h1_token) AS h1_lease2 \gset
SELECT clock_timestamp() AS t1 \gset
SELECT :'h1_lease2'::timestamptz > :'h1_lease'::timestamptz AS extended,
       :'h1_lease2'::timestamptz BETWEEN :'t0'::timestamptz + interval '30 seconds'
                                     AND :'t1'::timestamptz + interval '30 seconds' AS by_queue_lease;
SELECT lease_until = :'h1_lease2' AS job_shows_new_lease FROM pgjq.job(:h1);
-- or by extend
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.heartbeat(:h1, :h1_token, extend => '10 minutes') AS h1_lease3 \gset
SELECT clock_timestamp() AS t1 \gset
SELECT :'h1_lease3'::timestamptz BETWEEN :'t0'::timestamptz + interval '10 minutes'
                                     AND :'t1'::timestamptz + interval '10 minutes' AS by_extend;
SELECT pgjq.heartbeat(:h1, :h1_token, '7 days') > now() + interval '6 days' AS seven_days;
-- extend must be within (0, 7 days]; a rejected call changes nothing
SELECT lease_until AS h1_lease4 FROM pgjq.job(:h1) \gset
SELECT pgjq.heartbeat(:h1, :h1_token, '0');
\echo :SQLSTATE
SELECT pgjq.heartbeat(:h1, :h1_token, '-1 second');
\echo :SQLSTATE
SELECT pgjq.heartbeat(:h1, :h1_token, '7 days 1 second');
\echo :SQLSTATE
SELECT state, attempt, lease_until = :'h1_lease4' AS lease_unchanged FROM pgjq.job(:h1);
-- stale: NULL
SELECT pgjq.heartbeat(:h1, :h1_token + 1) IS NULL AS wrong_token;
SELECT pgjq.heartbeat(-1, 1) IS NULL AS unknown_id;
SELECT pgjq.complete(:h1, :h1_token);
SELECT pgjq.heartbeat(:h1, :h1_token) IS NULL AS after_complete;

---------------------------------------------------------------- snooze
-- snooze puts the job back to scheduled after delay and gives back the attempt
SELECT pgjq.enqueue('qo') AS s1 \gset
SELECT token AS s1_token FROM pgjq.claim('qo') \gset
SELECT clock_timestamp() AS t0 \gset
SELECT pgjq.snooze(:s1, :s1_token, '1 hour');
SELECT clock_timestamp() AS t1 \gset
SELECT state, attempt, lease_until,
       run_at BETWEEN :'t0'::timestamptz + interval '1 hour' AND :'t1'::timestamptz + interval '1 hour'
         AS run_at_after_delay
  FROM pgjq.job(:s1);
-- the token is stale afterwards
SELECT pgjq.snooze(:s1, :s1_token, '1 hour') AS snooze_again;
SELECT pgjq.complete(:s1, :s1_token) AS complete_after_snooze;
-- snoozing any number of times never spends the attempts (max_attempts 3)
SELECT pgjq.enqueue('qo') AS s2 \gset
DO $$
DECLARE
	c record;
BEGIN
	FOR i IN 1..5 LOOP
		SELECT * INTO c FROM pgjq.claim('qo');
		IF c.id IS NULL OR c.attempt <> 1 THEN
			RAISE EXCEPTION 'round %: claimed % attempt %', i, c.id, c.attempt;
		END IF;
		IF NOT pgjq.snooze(c.id, c.token, '0') THEN
			RAISE EXCEPTION 'round %: snooze refused', i;
		END IF;
		-- a snoozed job is claimable again once the snooze commits
		COMMIT;
		PERFORM pgjq.promote();
		COMMIT;
	END LOOP;
END
$$;
SELECT state, attempt FROM pgjq.job(:s2);
SELECT id = :s2 AS is_s2, attempt FROM pgjq.claim('qo');
-- delay is required and within [0, 3650 days]
SELECT pgjq.enqueue('qo') AS s3 \gset
SELECT token AS s3_token FROM pgjq.claim('qo') \gset
SELECT pgjq.snooze(:s3, :s3_token, NULL);
\echo :SQLSTATE
SELECT pgjq.snooze(:s3, :s3_token, '-1 second');
\echo :SQLSTATE
SELECT pgjq.snooze(:s3, :s3_token, '3651 days');
\echo :SQLSTATE
SELECT state, attempt FROM pgjq.job(:s3);
SELECT pgjq.snooze(-1, 1, '1 second') AS unknown_id;
SELECT pgjq.purge('qo');

---------------------------------------------------------------- cancel
-- a ready job and a scheduled job are cancelled at once
SELECT pgjq.enqueue('qo') AS x1 \gset
SELECT pgjq.enqueue('qo', delay => '1 hour') AS x2 \gset
SELECT pgjq.cancel(:x1) AS cancel_ready, pgjq.cancel(:x2) AS cancel_scheduled;
SELECT id = :x1 AS is_x1, state, finished_at IS NOT NULL AS finished, cancel_requested
  FROM pgjq.job(:x1) UNION ALL
SELECT id = :x1, state, finished_at IS NOT NULL, cancel_requested FROM pgjq.job(:x2);
SELECT count(*) AS claimed FROM pgjq.claim('qo');
-- cancelling a finished job or an unknown id answers false
SELECT pgjq.cancel(:x1) AS cancel_cancelled, pgjq.cancel(:c1) AS cancel_completed,
       pgjq.cancel(:f5) AS cancel_dead, pgjq.cancel(-1) AS cancel_unknown;
-- a running job is only marked; it keeps running until its worker hears of it
SELECT pgjq.enqueue('qo') AS x3 \gset
SELECT token AS x3_token FROM pgjq.claim('qo') \gset
SELECT pgjq.cancel(:x3) AS cancel_running;
SELECT state, cancel_requested FROM pgjq.job(:x3);
-- the next heartbeat answers NULL and ends the job as cancelled
SELECT pgjq.heartbeat(:x3, :x3_token) IS NULL AS heartbeat_is_null;
SELECT state, cancel_requested FROM pgjq.job(:x3);
SELECT pgjq.complete(:x3, :x3_token) AS complete_after_cancel;
SELECT state FROM pgjq.job(:x3);
-- complete after a cancel request answers false and ends it as cancelled
SELECT pgjq.enqueue('qo') AS x4 \gset
SELECT token AS x4_token FROM pgjq.claim('qo') \gset
SELECT pgjq.cancel(:x4);
SELECT pgjq.complete(:x4, :x4_token) AS complete_after_cancel;
SELECT state FROM pgjq.job(:x4);
-- so does complete(ids[], tokens[]): not counted
SELECT pgjq.enqueue('qo') AS x5 \gset
SELECT token AS x5_token FROM pgjq.claim('qo') \gset
SELECT pgjq.cancel(:x5);
SELECT pgjq.complete(ARRAY[:x5], ARRAY[:x5_token]) AS completed;
SELECT state FROM pgjq.job(:x5);
-- fail answers 'stale', snooze false; both end it as cancelled
SELECT pgjq.enqueue('qo') AS x6 \gset
SELECT token AS x6_token FROM pgjq.claim('qo') \gset
SELECT pgjq.cancel(:x6);
SELECT pgjq.fail(:x6, :x6_token, 'stopped') AS fail_after_cancel;
SELECT state FROM pgjq.job(:x6);
SELECT pgjq.enqueue('qo') AS x7 \gset
SELECT token AS x7_token FROM pgjq.claim('qo') \gset
SELECT pgjq.cancel(:x7);
SELECT pgjq.snooze(:x7, :x7_token, '1 second') AS snooze_after_cancel;
SELECT state FROM pgjq.job(:x7);
SELECT regress.counts('qo');

---------------------------------------------------------------- retry_dead
SELECT pgjq.create_queue('qo_dead', max_attempts => 1);
SELECT count(*) FROM pgjq.enqueue_many('qo_dead', ARRAY['{"d": 1}', '{"d": 2}', '{"d": 3}']::jsonb[],
                                       dedup_keys => ARRAY['d1', 'd2', 'd3']);
CREATE TEMP TABLE d AS SELECT * FROM pgjq.claim('qo_dead', 3);
SELECT pgjq.fail(id, token, 'fatal') AS outcome, count(*) FROM d GROUP BY 1;
SELECT regress.counts('qo_dead');
SELECT min(id) AS d1, max(id) AS d3 FROM d \gset
-- by ids: only those, and only if dead
SELECT pgjq.retry_dead('qo_dead', ARRAY[:d1, -1]) AS redriven;
SELECT state, attempt, last_error, payload FROM pgjq.job(:d1);
SELECT pgjq.retry_dead('qo_dead', ARRAY[:d1]) AS not_dead_any_more;
SELECT regress.counts('qo_dead');
-- a dead job whose dedup_key an unfinished job has taken stays dead
SELECT pgjq.enqueue('qo_dead', dedup_key => 'd3') <> :d3 AS new_d3;
-- all the others
SELECT pgjq.retry_dead('qo_dead') AS redriven;
SELECT state FROM pgjq.job(:d3);
SELECT regress.counts('qo_dead');
-- redriven jobs are claimable with fresh attempts and their payload
SELECT payload, attempt FROM pgjq.claim('qo_dead', 10) ORDER BY payload;
SELECT pgjq.retry_dead('qo_dead') AS nothing_dead;
SELECT pgjq.retry_dead('qo_dead', '{}') AS empty_ids;
-- unknown queue, NULL elements
SELECT pgjq.retry_dead('qo_nope');
\echo :SQLSTATE
SELECT pgjq.retry_dead('qo_dead', ARRAY[NULL::bigint]);
\echo :SQLSTATE
-- two dead jobs may share a dedup_key (the key is free again once the first
-- died); only one of them can be unfinished: the other stays dead, and the
-- rest of the queue's dead jobs are redriven all the same
SELECT pgjq.create_queue('qo_dead2', max_attempts => 1);
DO $$
DECLARE
	c record;
BEGIN
	FOR i IN 1..3 LOOP
		PERFORM pgjq.enqueue('qo_dead2', jsonb_build_object('i', i),
		                     dedup_key => CASE WHEN i < 3 THEN 'same' END);
		SELECT * INTO c FROM pgjq.claim('qo_dead2');
		PERFORM pgjq.fail(c.id, c.token, 'fatal');
	END LOOP;
END
$$;
SELECT regress.counts('qo_dead2');
SELECT pgjq.retry_dead('qo_dead2') AS redriven;
SELECT regress.counts('qo_dead2');
SELECT pgjq.retry_dead('qo_dead2') AS redriven_again;
SELECT pgjq.drop_queue('qo_dead2');
-- another queue's dead jobs are not touched
SELECT pgjq.retry_dead('qo', ARRAY[:d3]) AS other_queue;
SELECT state FROM pgjq.job(:d3);

SELECT pgjq.drop_queue('qo', force => true);
SELECT pgjq.drop_queue('qo_dead', force => true);
