--
-- wait: claim(..., wait), claim(queues[], ...) and CALL await().  Only what
-- one session can show: how long an idle wait lasts, that a ready job ends
-- it at once, and the arguments.  Wake-ups by other sessions' commits are in
-- the isolation specs.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qw1');
SELECT pgjq.create_queue('qw2', lease => '5 minutes');

---------------------------------------------------------------- claim with wait
-- nothing to claim: the call sleeps for the wait, then returns no rows
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('qw1', wait => '100 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '100 milliseconds' AS waited;
-- a ready job ends the wait at once
SELECT pgjq.enqueue('qw1', '{"w": 1}') > 0 AS enqueued;
SELECT clock_timestamp() AS t0 \gset
SELECT payload FROM pgjq.claim('qw1', wait => '10 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '5 seconds' AS returned_at_once;
-- wait 0 or NULL: no wait
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('qw1', wait => '0');
SELECT count(*) AS claimed FROM pgjq.claim('qw1', wait => NULL);
SELECT clock_timestamp() - :'t0'::timestamptz < interval '5 seconds' AS returned_at_once;
-- pgjq.max_wait caps the wait
SET pgjq.max_wait = '100ms';
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim('qw1', wait => '1 hour');
SELECT clock_timestamp() - :'t0'::timestamptz BETWEEN interval '100 milliseconds' AND interval '10 seconds'
         AS capped;
RESET pgjq.max_wait;
-- a paused queue is waited on like an empty one
SELECT pgjq.enqueue('qw1') > 0 AS enqueued;
SELECT pgjq.pause('qw1');
SELECT count(*) AS claimed_while_paused FROM pgjq.claim('qw1', wait => '50 milliseconds');
SELECT pgjq.resume('qw1');
SELECT count(*) AS claimed FROM pgjq.claim('qw1', wait => '50 milliseconds');
-- wait needs READ COMMITTED: 25001
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM pgjq.claim('qw1', wait => '1 second');
\echo :SQLSTATE
ROLLBACK;
-- without wait, any isolation level is fine
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT count(*) AS claimed FROM pgjq.claim('qw1');
COMMIT;
-- wait is within [0, 3650 days]: 22023
SELECT count(*) FROM pgjq.claim('qw1', wait => '-1 second');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim('qw1', wait => '3651 days');
\echo :SQLSTATE

---------------------------------------------------------------- several queues
-- queues are served in the array's order; one token for the whole call
SELECT count(*) FROM pgjq.enqueue_many('qw1', ARRAY['{"q": 1, "n": 1}', '{"q": 1, "n": 2}']::jsonb[]);
SELECT count(*) FROM pgjq.enqueue_many('qw2', ARRAY['{"q": 2, "n": 1}', '{"q": 2, "n": 2}']::jsonb[]);
CREATE TEMP TABLE m AS
	SELECT c.*, now() AS t_before, clock_timestamp() AS t_after
	  FROM pgjq.claim(ARRAY['qw2', 'qw1'], 3) WITH ORDINALITY c;
SELECT ordinality, payload FROM m ORDER BY ordinality;
SELECT count(DISTINCT token) AS tokens FROM m;
-- each job gets its own queue's lease (qw2: 5 minutes, qw1: 30 seconds)
SELECT bool_and(lease_until BETWEEN t_before + CASE WHEN payload->>'q' = '2' THEN interval '5 minutes' ELSE interval '30 seconds' END
                              AND t_after + CASE WHEN payload->>'q' = '2' THEN interval '5 minutes' ELSE interval '30 seconds' END)
         AS own_queues_lease
  FROM m;
SELECT pgjq.complete(array_agg(id), array_agg(token)) AS completed FROM m;
-- a list of one queue
SELECT count(*) FROM pgjq.enqueue_many('qw2', ARRAY['{"q": 2, "n": 9}']::jsonb[]);
SELECT payload FROM pgjq.claim(ARRAY['qw2']);
-- a paused queue in the list is skipped
SELECT count(*) FROM pgjq.enqueue_many('qw2', ARRAY['{"q": 2, "n": 3}']::jsonb[]);
SELECT pgjq.pause('qw2');
SELECT payload FROM pgjq.claim(ARRAY['qw2', 'qw1'], 10);
SELECT pgjq.resume('qw2');
-- and with wait: nothing in either queue, so it sleeps
SELECT pgjq.purge('qw2');
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgjq.claim(ARRAY['qw1', 'qw2'], 10, wait => '100 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '100 milliseconds' AS waited;
-- bad lists
SELECT count(*) FROM pgjq.claim('{}'::text[]);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(NULL::text[]);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(ARRAY['qw1', NULL]);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(ARRAY['qw1', 'qw_nope']);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(ARRAY['qw1', 'not valid']);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(array_fill('qw1'::text, ARRAY[33]));
\echo :SQLSTATE
SELECT count(*) AS claimed FROM pgjq.claim(array_fill('qw1'::text, ARRAY[32]));
SELECT count(*) FROM pgjq.claim(ARRAY['qw1'], 0);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(ARRAY[['qw1']]);
\echo :SQLSTATE

---------------------------------------------------------------- await
-- returns once a queue has a ready job, or when the wait ends
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['qw1', 'qw2'], '100 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '100 milliseconds' AS waited;
SELECT pgjq.enqueue('qw2') > 0 AS enqueued;
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['qw1', 'qw2'], '10 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '5 seconds' AS returned_at_once;
SELECT count(*) AS claimed FROM pgjq.claim(ARRAY['qw1', 'qw2']);
-- inside a transaction block it works too
BEGIN;
SELECT clock_timestamp() AS t0 \gset
CALL pgjq.await(ARRAY['qw1'], '50 milliseconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '50 milliseconds' AS waited;
COMMIT;
-- arguments
CALL pgjq.await(ARRAY['qw1'], NULL);
\echo :SQLSTATE
CALL pgjq.await(NULL, '1 second');
\echo :SQLSTATE
CALL pgjq.await('{}', '1 second');
\echo :SQLSTATE
CALL pgjq.await(ARRAY['qw_nope'], '1 second');
\echo :SQLSTATE
CALL pgjq.await(ARRAY['qw1'], '-1 second');
\echo :SQLSTATE

SELECT pgjq.drop_queue('qw1', force => true);
SELECT pgjq.drop_queue('qw2', force => true);
