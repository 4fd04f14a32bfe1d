--
-- maintenance: promote(), rescue(), prune() and maintain(), called by hand
-- (the background worker serves no database during these tests).
--
\set VERBOSITY terse

-- earlier files leave nothing due behind: these counts are all ours
SELECT promoted, rescued FROM pgjq.maintain();

-- backoff 0, so a rescued job is due again at once
SELECT pgjq.create_queue('qm', backoff_base => '0', backoff_max => '0', max_attempts => 2);

---------------------------------------------------------------- promote
-- scheduled jobs become ready once due, and only then
SELECT count(*) FROM pgjq.enqueue_many('qm', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[],
                                       delay => '10 milliseconds');
SELECT pgjq.enqueue('qm', '{"n": 4}', delay => '1 hour') AS later \gset
SELECT regress.counts('qm');
SELECT count(*) AS claimed_before_promote FROM pgjq.claim('qm');
SELECT pg_sleep(0.05);
SELECT pgjq.promote() AS promoted;
SELECT regress.counts('qm');
SELECT pgjq.promote() AS promoted_again;
SELECT state FROM pgjq.job(:later);
-- promoted jobs are handed out in order
CREATE TEMP TABLE promoted AS SELECT * FROM pgjq.claim('qm', 10) WITH ORDINALITY c;
SELECT payload FROM promoted ORDER BY ordinality;
SELECT pgjq.complete(array_agg(id), array_agg(token)) AS completed FROM promoted;
-- promote() covers every queue, including a paused one (claims still wait)
SELECT pgjq.create_queue('qm_paused');
SELECT pgjq.pause('qm_paused');
SELECT pgjq.enqueue('qm_paused', delay => '10 milliseconds') > 0 AS enqueued;
SELECT pg_sleep(0.05);
SELECT pgjq.promote() AS promoted;
SELECT regress.counts('qm_paused');
SELECT count(*) AS claimed FROM pgjq.claim('qm_paused');
SELECT pgjq.drop_queue('qm_paused');
SELECT pgjq.purge('qm');

---------------------------------------------------------------- rescue
-- a lease that has not expired is left alone
SELECT pgjq.enqueue('qm', '{"n": "long"}') AS long_job \gset
SELECT token AS long_token FROM pgjq.claim('qm', lease => '1 hour') \gset
SELECT pgjq.rescue() AS rescued;
SELECT state FROM pgjq.job(:long_job);
-- an expired lease is a failed attempt ("lease expired"), retried after backoff
SELECT pgjq.enqueue('qm', '{"n": "r"}') AS r1 \gset
SELECT token AS r1_token FROM pgjq.claim('qm', lease => '10 milliseconds') \gset
SELECT pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT state, attempt, last_error, lease_until FROM pgjq.job(:r1);
SELECT pgjq.rescue() AS rescued_again;
-- the rescued worker is fenced off: its token is stale
SELECT pgjq.heartbeat(:r1, :r1_token) IS NULL AS heartbeat_is_null;
SELECT pgjq.complete(:r1, :r1_token) AS complete_after_rescue;
SELECT pgjq.fail(:r1, :r1_token, 'late') AS fail_after_rescue;
SELECT pgjq.snooze(:r1, :r1_token, '1 second') AS snooze_after_rescue;
SELECT state, attempt, last_error FROM pgjq.job(:r1);
-- the retry runs with a new token; its lease expires too: attempts spent, dead
SELECT pgjq.promote() AS promoted;
SELECT id = :r1 AS is_r1, attempt, token > :r1_token AS new_token
  FROM pgjq.claim('qm', lease => '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT state, attempt, last_error, payload FROM pgjq.job(:r1);
SELECT pgjq.complete(:long_job, :long_token) AS long_job_completes;
-- a job whose cancellation was requested ends cancelled when its lease expires
SELECT pgjq.enqueue('qm') AS x1 \gset
SELECT token AS x1_token FROM pgjq.claim('qm', lease => '10 milliseconds') \gset
SELECT pgjq.cancel(:x1);
SELECT pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT state FROM pgjq.job(:x1);
SELECT regress.counts('qm');

---------------------------------------------------------------- prune
-- prune() returns how many history partitions it removed; retention is a day
-- here, so this hour's finished jobs stay
SELECT pgjq.prune() >= 0 AS pruned_some_or_none;
SELECT regress.counts('qm');
SELECT state FROM pgjq.job(:long_job);

---------------------------------------------------------------- maintain
-- rescue, then promote (so a rescued job due at once is ready at once), then prune
SELECT pgjq.enqueue('qm', delay => '10 milliseconds') AS m1 \gset
SELECT pgjq.enqueue('qm') AS m2 \gset
SELECT id = :m2 AS is_m2 FROM pgjq.claim('qm', lease => '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT promoted, rescued, pruned >= 0 AS pruned_some_or_none FROM pgjq.maintain();
SELECT state, attempt, last_error FROM pgjq.job(:m1) UNION ALL
SELECT state, attempt, last_error FROM pgjq.job(:m2);
SELECT * FROM pgjq.maintain() WHERE promoted <> 0 OR rescued <> 0;
-- the column names and types
SELECT pg_get_function_arguments('pgjq.maintain'::regproc) AS maintain_columns;

SELECT pgjq.drop_queue('qm', force => true);
