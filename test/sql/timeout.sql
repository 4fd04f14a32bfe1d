--
-- timeout: an execution deadline apart from the lease, a queue's or a job's
-- own.  A claim's lease never goes past claim time + timeout, a heartbeat
-- cannot extend it past that and returns NULL once it has passed, and
-- rescue then ends the attempt as failed with an error that says so.  A
-- job's timeout goes with it (retry, redrive, delay).  Crash and restart:
-- test/t/026_timeout_crash.pl.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qt', lease => '1 hour', timeout => '300 ms', backoff_base => '1 hour');
SELECT queue, lease, timeout FROM pgjq.list_queues() WHERE queue = 'qt';
SELECT pgjq.enqueue('qt', '{"n": 1}') AS j1 \gset

-- the lease ends at the deadline, not an hour from now
SELECT id, token, lease_until <= clock_timestamp() + interval '300 ms' AS capped,
       lease_until > clock_timestamp() AS not_yet
  FROM pgjq.claim('qt') \gset c_
SELECT :'c_capped' AS capped, :'c_not_yet' AS not_yet;

-- a heartbeat asking for an hour gets no further than the deadline
SELECT pgjq.heartbeat(:c_id, :c_token, '1 hour') <= clock_timestamp() + interval '300 ms' AS capped;

-- past the deadline: the heartbeat says so (NULL) and changes nothing
SELECT pg_sleep(0.4);
SELECT pgjq.heartbeat(:c_id, :c_token, '1 hour') IS NULL AS timed_out;
SELECT state FROM pgjq.job(:c_id);

-- rescue ends the attempt as failed, saying why; a retry follows the backoff
SELECT pgjq.rescue();
SELECT state, attempt, last_error FROM pgjq.job(:c_id);

-- the timeout changes with alter_queue ('0' removes it) and holds for claims after it
SELECT pgjq.alter_queue('qt', timeout => '0');
SELECT timeout FROM pgjq.list_queues() WHERE queue = 'qt';
SELECT pgjq.enqueue('qt', '{"n": 2}') AS j2 \gset
SELECT lease_until > clock_timestamp() + interval '50 minutes' AS full_lease FROM pgjq.claim('qt');
SELECT pgjq.alter_queue('qt', timeout => '2 hours');
SELECT timeout FROM pgjq.list_queues() WHERE queue = 'qt';
SELECT pgjq.enqueue('qt', '{"n": 3}') AS j3 \gset
-- a timeout longer than the lease leaves the lease as it was
SELECT lease_until > clock_timestamp() + interval '50 minutes' AS full_lease FROM pgjq.claim('qt');

-- the fused cycle claims under the same deadline
SELECT pgjq.alter_queue('qt', timeout => '1 minute');
SELECT pgjq.enqueue('qt', '{"n": 4}') AS j4 \gset
SELECT lease_until <= clock_timestamp() + interval '1 minute' AS capped
  FROM pgjq.complete_and_claim('qt', NULL, NULL);

-- a job's own timeout: in a queue without one, and replacing the queue's
SELECT pgjq.create_queue('qj', lease => '1 hour', backoff_base => '0', max_attempts => 2);
SELECT pgjq.enqueue('qj', '{"own": true}', timeout => '10 minutes') AS own \gset
SELECT count(*) FROM pgjq.enqueue_many('qj', ARRAY['{"plain": 1}', '{"plain": 2}']::jsonb[]);
-- one claim of both kinds: each job has its own lease, and the claim writes
-- one 'c' row per deadline (two here)
CREATE TEMP TABLE cj AS SELECT id, token, lease_until FROM pgjq.claim('qj', 3);
SELECT id = :own AS own, lease_until <= clock_timestamp() + interval '10 minutes' AS capped
  FROM cj ORDER BY id;
SELECT count(*) AS claim_rows, count(deadline) AS with_deadline
  FROM (SELECT token, kind, deadline FROM pgjq.ring_log_0 UNION ALL SELECT token, kind, deadline FROM pgjq.ring_log_1
        UNION ALL SELECT token, kind, deadline FROM pgjq.ring_log_2 UNION ALL SELECT token, kind, deadline FROM pgjq.ring_log_3) l
 WHERE kind = 'c' AND token = (SELECT min(token) FROM cj);
-- its heartbeat stops at its deadline; the others extend freely
SELECT pgjq.heartbeat(id, token, '1 hour') <= clock_timestamp() + interval '10 minutes' AS capped
  FROM cj ORDER BY id;
-- the timeout goes with the job: a retry (through pgjq.job) is claimed under it again
SELECT pgjq.fail(id, token, 'again') FROM cj WHERE id = :own;
SELECT pgjq.promote() >= 1 AS promoted;
SELECT id = :own AS own, token, lease_until <= clock_timestamp() + interval '10 minutes' AS capped
  FROM pgjq.claim('qj') \gset r_
SELECT :'r_own' AS own, :'r_capped' AS capped;
-- ... and so does a dead job redriven by retry_dead
SELECT pgjq.fail(:own, :r_token, 'dead now');
SELECT state FROM pgjq.job(:own);
SELECT pgjq.retry_dead('qj', ARRAY[:own]::bigint[]);
SELECT lease_until <= clock_timestamp() + interval '10 minutes' AS capped FROM pgjq.claim('qj');
-- a delayed job keeps it too (it waits in pgjq.job until due)
SELECT pgjq.enqueue('qj', '{"later": true}', delay => '1 ms', timeout => '5 minutes') AS later \gset
SELECT pg_sleep(0.01);
SELECT pgjq.promote();
SELECT lease_until <= clock_timestamp() + interval '5 minutes' AS capped FROM pgjq.claim('qj');
-- a job's timeout replaces the queue's, longer or shorter
SELECT pgjq.alter_queue('qj', timeout => '1 minute');
SELECT pgjq.enqueue('qj', '{"longer": true}', timeout => '30 minutes') AS longer \gset
SELECT lease_until > clock_timestamp() + interval '20 minutes' AS own_deadline FROM pgjq.claim('qj');

-- bad values, named
SELECT pgjq.enqueue('qj', timeout => '0');
SELECT pgjq.enqueue_many('qj', ARRAY['{}']::jsonb[], timeout => '400 days');
SELECT pgjq.create_queue('qt_bad', timeout => '-1 s');
SELECT pgjq.alter_queue('qt', timeout => '400 days');
SELECT count(*) FROM pgjq.list_queues() WHERE queue = 'qt_bad';

SELECT pgjq.drop_queue('qt', force => true);
SELECT pgjq.drop_queue('qj', force => true);
