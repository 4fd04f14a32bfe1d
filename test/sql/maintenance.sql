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
-- prune() returns how many history partitions it emptied; retention is a day
-- here, so this hour's finished jobs stay
SELECT pgjq.prune() AS pruned;
SELECT regress.counts('qm');
SELECT state FROM pgjq.job(:long_job);

-- A partition is removed once its hour (plus 5 minutes of grace) and the
-- longest retention of the queues with rows in it have passed.  Real ones
-- take an hour to expire, so this is white-box: partitions of hours ten days
-- ago are made as the storage layer makes them, and finished jobs are moved
-- into them (what their history looks like ten days on).
CREATE FUNCTION regress.old_partition(tbl text, hours_ago int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  lo timestamptz := date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                    - hours_ago * interval '1 hour';
  name text := tbl || '_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24');
BEGIN
  EXECUTE format('CREATE TABLE pgjq.%I (LIKE pgjq.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                 name, tbl);
  EXECUTE format('ALTER TABLE pgjq.%I ATTACH PARTITION pgjq.%I FOR VALUES FROM (%L) TO (%L)',
                 tbl, name, lo, lo + interval '1 hour');
  INSERT INTO pgjq.history_partition (relname, parent, lower_bound, upper_bound)
    VALUES (name, tbl, lo, lo + interval '1 hour');
  RETURN name;
END $$;
-- move a finished job's history into the partition of an hour long past
CREATE FUNCTION regress.age_job(job bigint, hours_ago int) RETURNS bigint
LANGUAGE sql AS $$
  WITH d AS (UPDATE pgjq.job_done SET finished_at = date_trunc('hour', now())
                    - hours_ago * interval '1 hour' + interval '30 minutes'
              WHERE job = ANY (ids) RETURNING 1),
       h AS (UPDATE pgjq.job_history SET finished_at = date_trunc('hour', now())
                    - hours_ago * interval '1 hour' + interval '30 minutes'
              WHERE id = job RETURNING 1)
  SELECT (SELECT count(*) FROM d) + (SELECT count(*) FROM h);
$$;
SELECT pgjq.create_queue('pr_1d', retention => '1 day', max_attempts => 1);
SELECT pgjq.create_queue('pr_9d', retention => '9 days', max_attempts => 1);
SELECT pgjq.create_queue('pr_30d', retention => '30 days', max_attempts => 1);
-- completed: pr_1d alone (expired), pr_1d with pr_30d (kept for pr_30d)
SELECT regress.old_partition('job_done', 240) AS p_done_1d \gset
SELECT regress.old_partition('job_done', 239) AS p_done_mixed \gset
SELECT pgjq.enqueue('pr_1d') AS j_1d \gset
SELECT pgjq.complete(id, token) FROM pgjq.claim('pr_1d');
SELECT pgjq.enqueue('pr_1d') AS j_1d_mixed \gset
SELECT pgjq.complete(id, token) FROM pgjq.claim('pr_1d');
SELECT pgjq.enqueue('pr_30d') AS j_30d_mixed \gset
SELECT pgjq.complete(id, token) FROM pgjq.claim('pr_30d');
SELECT regress.age_job(:j_1d, 240) + regress.age_job(:j_1d_mixed, 239) + regress.age_job(:j_30d_mixed, 239) AS moved;
-- dead: pr_9d (expired after 9 days), pr_30d (kept)
SELECT regress.old_partition('job_history', 238) AS p_hist_9d \gset
SELECT regress.old_partition('job_history', 237) AS p_hist_30d \gset
SELECT pgjq.enqueue('pr_9d') AS j_9d \gset
SELECT pgjq.fail(id, token, 'boom') FROM pgjq.claim('pr_9d');
SELECT pgjq.enqueue('pr_30d') AS j_30d \gset
SELECT pgjq.fail(id, token, 'boom') FROM pgjq.claim('pr_30d');
SELECT regress.age_job(:j_9d, 238) + regress.age_job(:j_30d, 237) AS moved;
-- empty: removed without being counted
SELECT regress.old_partition('job_done', 236) AS p_empty \gset
-- two partitions emptied (the empty one is dropped, not counted)
SELECT pgjq.prune() AS pruned;
SELECT part, to_regclass('pgjq.' || relname) IS NOT NULL AS present,
       relname IN (SELECT hp.relname FROM pgjq.history_partition hp) AS listed
  FROM unnest(ARRAY['done 1d', 'done 1d+30d', 'history 9d', 'history 30d', 'empty'],
              ARRAY[:'p_done_1d', :'p_done_mixed', :'p_hist_9d', :'p_hist_30d', :'p_empty'])
       WITH ORDINALITY AS u(part, relname, n)
 ORDER BY n;
SELECT job, (SELECT state FROM pgjq.job(j)) AS state
  FROM unnest(ARRAY['1d alone', '1d with 30d', '30d with 1d', '9d', '30d'],
              ARRAY[:j_1d, :j_1d_mixed, :j_30d_mixed, :j_9d, :j_30d])
       WITH ORDINALITY AS u(job, j, n)
 ORDER BY n;
-- what is kept is kept: a second prune removes nothing
SELECT pgjq.prune() AS pruned;
-- until the longest retention in it is lowered
SELECT pgjq.alter_queue('pr_30d', retention => '1 day');
SELECT pgjq.prune() AS pruned;
SELECT count(*) AS left_of_ten_days_ago FROM pgjq.history_partition
 WHERE relname IN (:'p_done_1d', :'p_done_mixed', :'p_hist_9d', :'p_hist_30d', :'p_empty');
SELECT pgjq.drop_queue(q) FROM unnest(ARRAY['pr_1d', 'pr_9d', 'pr_30d']) q;
DROP FUNCTION regress.old_partition(text, int), regress.age_job(bigint, int);

---------------------------------------------------------------- maintain
-- rescue, then promote (so a rescued job due at once is ready at once), then prune
SELECT pgjq.enqueue('qm', delay => '10 milliseconds') AS m1 \gset
SELECT pgjq.enqueue('qm') AS m2 \gset
SELECT id = :m2 AS is_m2 FROM pgjq.claim('qm', lease => '10 milliseconds');
SELECT pg_sleep(0.05);
SELECT promoted, rescued, pruned FROM pgjq.maintain();
SELECT state, attempt, last_error FROM pgjq.job(:m1) UNION ALL
SELECT state, attempt, last_error FROM pgjq.job(:m2);
SELECT * FROM pgjq.maintain() WHERE promoted <> 0 OR rescued <> 0;
-- the column names and types
SELECT pg_get_function_arguments('pgjq.maintain'::regproc) AS maintain_columns;

SELECT pgjq.drop_queue('qm', force => true);
