--
-- dedup_scope: how long a dedup_key holds ('unfinished', 'waiting', or
-- dedup_for => interval from the enqueue) and what a duplicate does
-- (on_duplicate => 'replace', debounce_max).  Races between producers:
-- test/specs/dedup_replace.spec; a restart: test/t/029_dedup_restart.pl.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('dd', backoff_base => '1 hour');

-- 'waiting': a duplicate gets the job while it waits ...
SELECT pgjq.enqueue('dd', '{"n": 1}', dedup_key => 'w', dedup_scope => 'waiting') AS w1 \gset
SELECT pgjq.enqueue('dd', '{"n": 2}', dedup_key => 'w', dedup_scope => 'waiting') = :w1 AS same_while_waiting;
-- ... and a new job once it was claimed (the claim freed the key)
CREATE TEMP TABLE got AS SELECT id, token FROM pgjq.claim('dd');
SELECT id = :w1 AS claimed FROM got;
SELECT pgjq.enqueue('dd', '{"n": 3}', dedup_key => 'w', dedup_scope => 'waiting') AS w2 \gset
SELECT :w2 <> :w1 AS new_while_running;
-- a retry of the claimed job does not take the key back: w2 keeps it
SELECT pgjq.fail(id, token, 'boom') FROM got;
SELECT id = :w1 AS same, state, dedup_key FROM pgjq.job(:w1);
SELECT pgjq.enqueue('dd', '{"n": 4}', dedup_key => 'w', dedup_scope => 'waiting') = :w2 AS held_by_the_new_one;
-- 'unfinished' (the default) holds it while the job runs
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'u', dedup_scope => 'unfinished') AS u \gset
SELECT pgjq.cancel(:w2);
TRUNCATE got;
INSERT INTO got SELECT id, token FROM pgjq.claim('dd');
SELECT id = :u AS claimed FROM got;
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'u') = :u AS held_while_running;
SELECT pgjq.complete(id, token) FROM got;
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'u') <> :u AS free_once_completed;
SELECT pgjq.purge('dd');

-- a delayed 'waiting' job holds its key until it is claimed, after promotion
SELECT pgjq.enqueue('dd', '{}', delay => '1 hour', dedup_key => 'wd', dedup_scope => 'waiting') AS wd \gset
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'wd', dedup_scope => 'waiting') = :wd AS same_while_scheduled;
SELECT pgjq.purge('dd');

-- on_duplicate => 'replace' of a ready job: same id, the new payload
SELECT pgjq.enqueue('dd', '{"v": 1}', dedup_key => 'r') AS r \gset
SELECT pgjq.enqueue('dd', '{"v": 2}', dedup_key => 'r', on_duplicate => 'replace') = :r AS same;
SELECT state, attempt, payload FROM pgjq.job(:r);
-- 'ignore' (the default) leaves it
SELECT pgjq.enqueue('dd', '{"v": 3}', dedup_key => 'r', on_duplicate => 'ignore') = :r AS same;
SELECT payload FROM pgjq.job(:r);
-- a delay moves it to the duplicate's due time: debounce
SELECT pgjq.enqueue('dd', '{"v": 4}', delay => '10 minutes', dedup_key => 'r',
                    on_duplicate => 'replace') = :r AS same;
SELECT state, payload, run_at - enqueued_at > interval '9 minutes' AS moved FROM pgjq.job(:r);
-- debounce_max bounds how far from its enqueue duplicates can move it
SELECT pgjq.enqueue('dd', '{"v": 5}', delay => '1 day', dedup_key => 'r',
                    on_duplicate => 'replace', debounce_max => '30 minutes') = :r AS same;
SELECT state, payload, run_at - enqueued_at AS from_enqueue FROM pgjq.job(:r);
-- and back to now: ready again, and the claim gets the last payload
SELECT pgjq.enqueue('dd', '{"v": 6}', dedup_key => 'r', on_duplicate => 'replace') = :r AS same;
SELECT state, payload FROM pgjq.job(:r);
TRUNCATE got;
INSERT INTO got SELECT id, token FROM pgjq.claim('dd');
SELECT g.id = :r AS claimed, j.payload, j.attempt FROM got g, pgjq.job(g.id) j;
-- a running job is left as it is; the duplicate gets its id
SELECT pgjq.enqueue('dd', '{"v": 7}', dedup_key => 'r', on_duplicate => 'replace') = :r AS same;
SELECT state, payload FROM pgjq.job(:r);
SELECT pgjq.complete(id, token) FROM got;
-- a replaced retry keeps its attempts
SELECT pgjq.enqueue('dd', '{"v": 1}', dedup_key => 'rr') AS rr \gset
TRUNCATE got;
INSERT INTO got SELECT id, token FROM pgjq.claim('dd');
SELECT pgjq.fail(id, token, 'try again') FROM got;
SELECT pgjq.enqueue('dd', '{"v": 2}', dedup_key => 'rr', on_duplicate => 'replace') = :rr AS same;
SELECT state, attempt, payload, last_error FROM pgjq.job(:rr);
SELECT pgjq.purge('dd');

-- enqueue_many: a later duplicate in the call replaces an earlier one
SELECT a[1] = a[2] AS one_job_for_m, a[3] <> a[1] AS another_for_null
  FROM (SELECT array_agg(i ORDER BY o) AS a
          FROM pgjq.enqueue_many('dd', ARRAY['{"m": 1}', '{"m": 2}', '{"m": 3}']::jsonb[],
                                 dedup_keys => ARRAY['m', 'm', NULL], on_duplicate => 'replace')
               WITH ORDINALITY AS t(i, o)) x;
SELECT payload FROM pgjq.claim('dd', 10) ORDER BY payload::text;
SELECT pgjq.purge('dd');

-- dedup_for: the key is held that long from the enqueue, whatever the job does
SELECT pgjq.enqueue('dd', '{"p": 1}', dedup_key => 'p', dedup_for => '1 hour') AS p \gset
SELECT pgjq.enqueue('dd', '{"p": 2}', dedup_key => 'p', dedup_for => '1 hour') = :p AS same;
-- the job itself has no dedup_key: the period holds it
SELECT state, payload, dedup_key FROM pgjq.job(:p);
-- replace while it waits
SELECT pgjq.enqueue('dd', '{"p": 3}', dedup_key => 'p', dedup_for => '1 hour',
                    on_duplicate => 'replace') = :p AS same;
SELECT state, payload FROM pgjq.job(:p);
TRUNCATE got;
INSERT INTO got SELECT id, token FROM pgjq.claim('dd');
SELECT pgjq.complete(id, token) FROM got;
-- completed, and still held: a duplicate gets the finished job's id
SELECT pgjq.enqueue('dd', '{"p": 4}', dedup_key => 'p', dedup_for => '1 hour',
                    on_duplicate => 'replace') = :p AS same_after_completion;
SELECT state, payload FROM pgjq.job(:p);
-- a key without dedup_for is another key space: not held by the period
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'p') <> :p AS other_space;
-- once the period ended, a new job takes the key over
SELECT pgjq.enqueue('dd', '{"q": 1}', dedup_key => 'q', dedup_for => '0.2 seconds') AS q \gset
SELECT pg_sleep(0.3);
SELECT pgjq.enqueue('dd', '{"q": 2}', dedup_key => 'q', dedup_for => '1 hour') <> :q AS taken_over;
SELECT count(*) FROM pgjq.dedup_period WHERE dedup_key = 'q';
-- prune deletes the periods that ended
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'e', dedup_for => '0.1 seconds') IS NOT NULL AS enqueued;
SELECT pg_sleep(0.2);
SELECT pgjq.prune() AS pruned;
SELECT dedup_key FROM pgjq.dedup_period ORDER BY 1;

-- bad arguments: clear errors, nothing written
SELECT count(*) AS jobs_before FROM pgjq.job;
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', dedup_scope => 'forever');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', dedup_scope => 'waiting', dedup_for => '1 hour');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', dedup_scope => 'unfinished', dedup_for => '1 hour');
SELECT pgjq.enqueue('dd', '{}', dedup_scope => 'waiting');
SELECT pgjq.enqueue('dd', '{}', on_duplicate => 'replace');
SELECT pgjq.enqueue('dd', '{}', dedup_for => '1 hour');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', on_duplicate => 'merge');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', debounce_max => '1 hour');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', dedup_for => '0 seconds');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', dedup_for => '3651 days');
SELECT pgjq.enqueue('dd', '{}', dedup_key => 'x', on_duplicate => 'replace', debounce_max => '-1 hour');
SELECT pgjq.enqueue_many('dd', ARRAY['{}']::jsonb[], dedup_scope => 'waiting');
SELECT count(*) AS jobs_after FROM pgjq.job;
SELECT count(*) AS no_period_for_x FROM pgjq.dedup_period WHERE dedup_key = 'x';

-- drop_queue takes its periods with it
SELECT pgjq.drop_queue('dd', force => true);
SELECT count(*) AS periods FROM pgjq.dedup_period;
SELECT area, object, expected, found FROM pgjq.verify();
DROP TABLE got;
