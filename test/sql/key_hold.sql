--
-- key_hold: hold_key(queue, fair_key, until) makes claims skip the key's
-- jobs until then without touching them (no attempt spent); release_key()
-- ends it; fail(..., hold_key_for) holds the failed job's key.  A hold takes
-- effect at commit.  A claim waiting while a key is released:
-- test/specs/key_hold_wake.spec; a restart: test/t/028_key_hold_restart.pl.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('kh', backoff_base => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('kh', array_fill('{}'::jsonb, ARRAY[6]),
                                       fair_keys => ARRAY['a', 'a', 'a', 'b', 'b', NULL]);
SELECT pgjq.hold_key('kh', 'a', now() + interval '1 hour');
SELECT ready, held_keys FROM pgjq.queue_stats WHERE queue = 'kh';

-- claims skip a's jobs: b's two and the one without a key
CREATE TEMP TABLE got AS SELECT id, token, fair_key FROM pgjq.claim('kh', 10);
SELECT coalesce(fair_key, '-') AS key, count(*) FROM got GROUP BY 1 ORDER BY 1;
SELECT count(*) AS nothing_more FROM pgjq.claim('kh', 10);

-- a worker told to come back later: fail holds the job's key
SELECT pgjq.fail(id, token, 'HTTP 429', hold_key_for => '1 hour') FROM got WHERE fair_key = 'b' LIMIT 1;
SELECT held_keys FROM pgjq.queue_stats WHERE queue = 'kh';
-- a stale token holds nothing
SELECT pgjq.fail(id, token + 1000, 'stale', hold_key_for => '1 hour') FROM got WHERE fair_key IS NULL;
SELECT held_keys FROM pgjq.queue_stats WHERE queue = 'kh';

-- release: a's jobs come back with no attempt spent
SELECT pgjq.release_key('kh', 'a'), pgjq.release_key('kh', 'a');
SELECT fair_key, attempt FROM pgjq.claim('kh', 10) ORDER BY id;

-- a hold in a transaction that rolls back holds nothing; one in a savepoint
-- that rolls back neither
SELECT pgjq.enqueue('kh', fair_key => 'c') AS c1 \gset
BEGIN;
SELECT pgjq.hold_key('kh', 'c', now() + interval '1 hour');
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT pgjq.hold_key('kh', 'c', now() + interval '1 hour');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT held_keys FROM pgjq.queue_stats WHERE queue = 'kh';
SELECT fair_key FROM pgjq.claim('kh');

-- a hold ends by itself
SELECT pgjq.enqueue('kh', fair_key => 'd') AS d1 \gset
SELECT pgjq.hold_key('kh', 'd', clock_timestamp() + interval '300 ms');
SELECT count(*) AS while_held FROM pgjq.claim('kh');
SELECT pg_sleep(0.4);
SELECT fair_key AS after_it FROM pgjq.claim('kh');

-- NULL holds the jobs without a key
SELECT pgjq.enqueue('kh') AS n1 \gset
SELECT pgjq.hold_key('kh', NULL, now() + interval '1 hour');
SELECT count(*) AS while_held FROM pgjq.claim('kh');
SELECT pgjq.release_key('kh', NULL);
SELECT count(*) AS released FROM pgjq.claim('kh');

-- bad arguments, named
SELECT pgjq.hold_key('kh', 'a', now() - interval '1 second');
SELECT pgjq.hold_key('kh', 'a', now() + interval '400 days');
SELECT pgjq.hold_key('kh', 'a', NULL);
SELECT pgjq.hold_key('no_such_queue', 'a', now() + interval '1 hour');
SELECT pgjq.hold_key('kh', repeat('k', 600), now() + interval '1 hour');
SELECT pgjq.release_key('no_such_queue', 'a');
SELECT pgjq.fail(1, 1, 'e', hold_key_for => '0');

-- a transaction that held a key cannot be prepared
BEGIN;
SELECT pgjq.hold_key('kh', 'z', now() + interval '1 hour');
PREPARE TRANSACTION 'pgjq_kh';
SELECT held_keys FROM pgjq.queue_stats WHERE queue = 'kh';

-- workers may hold keys
SELECT has_function_privilege('pgjq_worker', 'pgjq.hold_key(text, text, timestamptz)', 'EXECUTE') AS worker,
       has_function_privilege('pgjq_producer', 'pgjq.hold_key(text, text, timestamptz)', 'EXECUTE') AS producer;

-- drop_queue takes its holds with it
SELECT pgjq.hold_key('kh', 'q', now() + interval '1 hour');
SELECT pgjq.drop_queue('kh', force => true);
SELECT count(*) FROM pgjq.key_holds;
