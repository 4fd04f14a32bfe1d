--
-- cycle: complete_and_claim, a worker's cycle in one statement: outcomes
-- (complete, or fail where errors[i] is given) then the next claim, with
-- stale tokens skipped, and the room the outcomes free under the limits.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qy', max_attempts => 2, backoff_base => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('qy', ARRAY['{"n":1}', '{"n":2}', '{"n":3}', '{"n":4}', '{"n":5}']::jsonb[]);

-- a first cycle has nothing to report: NULL (or empty) arrays
CREATE TEMP TABLE held AS SELECT * FROM pgjq.complete_and_claim('qy', NULL, NULL, batch => 2);
SELECT payload, attempt, token > 0 AS has_token FROM held ORDER BY id;

-- the next cycle completes what it holds and claims the next batch
CREATE TEMP TABLE held2 AS
	SELECT * FROM pgjq.complete_and_claim('qy', (SELECT array_agg(id ORDER BY id) FROM held),
										  (SELECT array_agg(token ORDER BY id) FROM held), 2);
SELECT payload FROM held2 ORDER BY id;
SELECT j.state FROM held, pgjq.job(held.id) j ORDER BY held.id;
-- the new claim has a token larger than the one of the completed jobs
SELECT (SELECT min(token) FROM held2) > (SELECT max(token) FROM held) AS new_token;

-- errors: NULL elements complete, others fail (retry with the queue's
-- backoff, or dead when the attempts are spent)
CREATE TEMP TABLE held3 AS
	SELECT * FROM pgjq.complete_and_claim('qy', (SELECT array_agg(id ORDER BY id) FROM held2),
										  (SELECT array_agg(token ORDER BY id) FROM held2),
										  batch => 1, errors => ARRAY[NULL, 'boom']);
SELECT j.payload, j.state, j.attempt, j.last_error
  FROM held2, pgjq.job(held2.id) j ORDER BY held2.id;
SELECT payload FROM held3;

-- a stale token changes nothing and is not reported: the claim still runs
SELECT pgjq.enqueue('qy', '{"n":6}') AS j6 \gset
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qy', ARRAY[(SELECT id FROM held3)], ARRAY[(SELECT token FROM held3) + 1000]);
SELECT j.state FROM held3, pgjq.job(held3.id) j;
-- the right token completes it; nothing left to claim
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qy', ARRAY[(SELECT id FROM held3)], ARRAY[(SELECT token FROM held3)]);
SELECT j.state FROM held3, pgjq.job(held3.id) j;

-- a job whose cancellation was requested ends as cancelled
SELECT pgjq.enqueue('qy', '{"n":7}') AS j7 \gset
SELECT token AS t7 FROM pgjq.claim('qy') \gset
SELECT pgjq.cancel(:j7);
SELECT count(*) AS claimed FROM pgjq.complete_and_claim('qy', ARRAY[:j7]::bigint[], ARRAY[:t7]::bigint[]);
SELECT state FROM pgjq.job(:j7);

-- a failure on the last attempt: dead
SELECT pgjq.promote() AS promoted;
UPDATE pgjq.job SET run_at = now() WHERE payload = '{"n":4}';
SELECT pgjq.promote() AS promoted;
SELECT id AS j4, token AS t4, attempt FROM pgjq.claim('qy') \gset
SELECT :attempt AS attempt;
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qy', ARRAY[:j4]::bigint[], ARRAY[:t4]::bigint[], errors => '{again}');
SELECT state, attempt, last_error FROM pgjq.job(:j4);

---------------------------------------------------------------- limits
-- at a concurrency limit the cycle takes the room its own outcomes free
SELECT pgjq.create_queue('qyl', concurrency => 2);
SELECT count(*) FROM pgjq.enqueue_many('qyl', array_fill('{}'::jsonb, ARRAY[7]));
CREATE TEMP TABLE lim AS SELECT * FROM pgjq.claim('qyl', 10);
SELECT count(*) AS claimed FROM lim;
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('qyl');
-- rolled back, a cycle leaves the two jobs running and claims nothing
BEGIN;
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qyl', (SELECT array_agg(id) FROM lim), (SELECT array_agg(token) FROM lim), 10);
ROLLBACK;
SELECT running FROM pgjq.queue_stats WHERE queue = 'qyl';
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('qyl');
-- committed, it completes two and claims two, never more than the limit
CREATE TEMP TABLE lim2 AS
	SELECT * FROM pgjq.complete_and_claim('qyl', (SELECT array_agg(id) FROM lim),
										  (SELECT array_agg(token) FROM lim), 10);
SELECT count(*) AS claimed FROM lim2;
SELECT running, ready FROM pgjq.queue_stats WHERE queue = 'qyl';
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('qyl');
-- the room of one completion serves one claim only, however many claims
-- follow in the transaction
BEGIN;
SELECT pgjq.complete((SELECT id FROM lim2 ORDER BY id LIMIT 1), (SELECT token FROM lim2 ORDER BY id LIMIT 1));
SELECT count(*) AS claimed FROM pgjq.claim('qyl', 10);
SELECT count(*) AS claimed_again FROM pgjq.claim('qyl', 10);
COMMIT;
SELECT running, ready FROM pgjq.queue_stats WHERE queue = 'qyl';
-- a stale outcome frees nothing
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qyl', ARRAY[(SELECT id FROM lim2 ORDER BY id DESC LIMIT 1)],
							   ARRAY[-1]::bigint[], 10);

-- the same per fair key under key_concurrency
SELECT pgjq.create_queue('qyk', key_concurrency => 1);
SELECT count(*) FROM pgjq.enqueue_many('qyk', array_fill('{}'::jsonb, ARRAY[3]), fair_keys => '{a,a,a}');
SELECT id AS k1, token AS kt1 FROM pgjq.claim('qyk', 10) \gset
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('qyk', 10);
SELECT id <> :k1 AS next_job, fair_key
  FROM pgjq.complete_and_claim('qyk', ARRAY[:k1]::bigint[], ARRAY[:kt1]::bigint[], 10);
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('qyk', 10);

---------------------------------------------------------------- bad input
SELECT * FROM pgjq.complete_and_claim('qy', '{1,2}', '{1}');
SELECT * FROM pgjq.complete_and_claim('qy', '{1,2}', NULL);
SELECT * FROM pgjq.complete_and_claim('qy', '{1,NULL}', '{1,2}');
SELECT * FROM pgjq.complete_and_claim('qy', '{1}', '{NULL}');
SELECT * FROM pgjq.complete_and_claim('qy', '{1,2}', '{1,2}', errors => '{x}');
SELECT * FROM pgjq.complete_and_claim('qy', '{{1,2}}', '{{1,2}}');
SELECT * FROM pgjq.complete_and_claim('qy', '{}', '{}', batch => 0);
SELECT * FROM pgjq.complete_and_claim('qy', '{}', '{}', batch => 10001);
SELECT * FROM pgjq.complete_and_claim('qy', '{}', '{}', lease => '-1 s');
SELECT * FROM pgjq.complete_and_claim('no_such_queue', '{}', '{}');
SELECT * FROM pgjq.complete_and_claim(NULL, '{}', '{}');
-- a bad queue undoes the outcomes: nothing half-done
SELECT pgjq.enqueue('qy', '{"n":8}') AS j8 \gset
SELECT token AS t8 FROM pgjq.claim('qy') \gset
SELECT * FROM pgjq.complete_and_claim('no_such_queue', ARRAY[:j8]::bigint[], ARRAY[:t8]::bigint[]);
SELECT state FROM pgjq.job(:j8);

SELECT pgjq.drop_queue(q, force => true) FROM unnest(ARRAY['qy', 'qyl', 'qyk']) q;
