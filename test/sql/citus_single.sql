--
-- citus_single: the Citus mode's functions on a single server (no Citus).
-- The queue-first forms are the plain forms; what needs Citus says so.
--
\set VERBOSITY default

SELECT pgjq.create_queue('cs');
SELECT pgjq.enqueue('cs', '{"n": 1}') AS id1 \gset
SELECT pgjq.enqueue('cs', '{"n": 2}') AS id2 \gset
SELECT pgjq.enqueue('cs', '{"n": 3}') AS id3 \gset
SELECT pgjq.enqueue('cs', '{"n": 4}') AS id4 \gset
-- ids and tokens stay small: no node group in their high bits
SELECT :id1 < (1::bigint << 48) AS single_server_ids;

SELECT array_agg(id ORDER BY id) AS ids, array_agg(token ORDER BY id) AS toks FROM pgjq.claim('cs', 4) \gset
SELECT (:'toks'::bigint[])[1] AS t1, (:'toks'::bigint[])[2] AS t2, (:'toks'::bigint[])[3] AS t3 \gset

-- the queue-first forms: the plain forms, on the only node
SELECT pgjq.complete_in('cs', ARRAY[:id1], ARRAY[:t1]::bigint[]);
SELECT pgjq.complete_in('cs', ARRAY[:id1], ARRAY[:t1]::bigint[]);	-- stale: 0
SELECT pgjq.heartbeat_in('cs', :id2, :t2, '1 minute') > now() AS extended;
SELECT pgjq.fail_in('cs', :id2, :t2, 'boom', retry_in => '1 hour');
SELECT pgjq.snooze_in('cs', :id3, :t3, '1 hour');
SELECT pgjq.cancel_in('cs', ARRAY[:id4]);
SELECT state, attempt FROM pgjq.job_in('cs', :id1);
SELECT state, last_error FROM pgjq.job_in('cs', :id2);
SELECT state FROM pgjq.job(:id3);

-- the queue names an unknown queue
SELECT pgjq.complete_in('nosuch', ARRAY[:id1], ARRAY[:t1]::bigint[]);
SELECT * FROM pgjq.job_in(NULL, :id1);

-- what needs Citus
SELECT * FROM pgjq.route('cs');
SELECT * FROM pgjq.citus_setup();
CALL pgjq.move_queues(1, 'localhost', 5432);
SELECT pgjq._citus_fence(1, 1, 'f');

-- the guard's setting is a superuser's: pgjq_admin may not turn it off (42501)
SET ROLE pgjq_admin;
\set VERBOSITY sqlstate
SET pgjq.citus_guard = off;
\set VERBOSITY default
SHOW pgjq.citus_guard;
RESET ROLE;

SELECT pgjq.drop_queue('cs', force => true);
