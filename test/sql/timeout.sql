--
-- timeout: a queue's execution deadline, apart from the lease.  A claim's
-- lease never goes past claim time + timeout, a heartbeat cannot extend it
-- past that and returns NULL once it has passed, and rescue then ends the
-- attempt as failed with an error that says so.  Crash and restart:
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

-- bad values, named
SELECT pgjq.create_queue('qt_bad', timeout => '-1 s');
SELECT pgjq.alter_queue('qt', timeout => '400 days');
SELECT count(*) FROM pgjq.list_queues() WHERE queue = 'qt_bad';

SELECT pgjq.drop_queue('qt', force => true);
