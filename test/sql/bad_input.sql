--
-- bad_input: every kind of bad argument raises a clear error with the right
-- SQLSTATE and leaves no trace.
--
-- After each rejected call, "unchanged" compares every queue's settings and
-- job counts (list_queues, queue_stats) with the state before the call.
--
\set VERBOSITY terse

CREATE FUNCTION regress.snapshot_api() RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT coalesce(string_agg(format('%s[%s %s %s %s %s %s] r%s s%s a%s d%s c%s x%s',
	                                  s.queue, q.lease, q.max_attempts, q.backoff_base,
	                                  q.backoff_max, q.retention, q.paused,
	                                  s.ready, s.scheduled, s.running, s.dead, s.completed,
	                                  s.cancelled), '; ' ORDER BY s.queue), '(no queues)')
	  FROM pgjq.queue_stats s JOIN pgjq.list_queues() q ON q.queue = s.queue
$$;
CREATE TABLE regress.baseline (snap text);
CREATE FUNCTION regress.unchanged() RETURNS boolean
LANGUAGE sql AS $$ SELECT snap = regress.snapshot_api() FROM regress.baseline $$;
CREATE FUNCTION regress.rebase() RETURNS text
LANGUAGE sql AS $$
	DELETE FROM regress.baseline;
	INSERT INTO regress.baseline SELECT regress.snapshot_api() RETURNING snap;
$$;

SELECT pgjq.create_queue('qb');
-- one running job (run_id, run_token) and one ready job
SELECT pgjq.enqueue('qb', '{"running": true}') AS run_id \gset
SELECT id = :run_id AS claimed_it, token AS run_token FROM pgjq.claim('qb') \gset
SELECT :'claimed_it' AS claimed_it;
SELECT pgjq.enqueue('qb', '{"ready": true}') AS ready_id \gset
SELECT regress.rebase() IS NOT NULL AS rebased;

---------------------------------------------------------------- NULL for required arguments: 22004
SELECT pgjq.create_queue(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.alter_queue(NULL, lease => '1 minute');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.drop_queue(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.pause(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.resume(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.purge(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many(NULL, ARRAY['{}']::jsonb[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', NULL]::jsonb[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.claim(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(NULL::bigint, :run_token);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(:run_id, NULL::bigint);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(NULL::bigint[], ARRAY[1]::bigint[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(ARRAY[1]::bigint[], NULL::bigint[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.fail(NULL, :run_token);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.fail(:run_id, NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.heartbeat(NULL, :run_token);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.heartbeat(:run_id, NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.snooze(NULL, :run_token, '1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.snooze(:run_id, NULL, '1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.snooze(:run_id, :run_token, NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.cancel(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.retry_dead(NULL);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- optional arguments given as NULL mean their defaults
SELECT id = :ready_id AS is_ready_id, token AS ready_token FROM pgjq.claim('qb', NULL, NULL, NULL) \gset
SELECT :'is_ready_id' AS is_ready_id;
SELECT pgjq.complete(:ready_id, :ready_token);
SELECT regress.rebase() IS NOT NULL AS rebased;

---------------------------------------------------------------- arrays
-- parallel arrays must match payloads in length: 22023
SELECT pgjq.enqueue_many('qb', ARRAY['{}', '{}']::jsonb[], fair_keys => ARRAY['a']);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', '{}']::jsonb[], dedup_keys => ARRAY['a', 'b', 'c']);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}']::jsonb[], fair_keys => '{}');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', '{}'::jsonb[], fair_keys => ARRAY['a']);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- multi-dimensional arrays: 22023
SELECT pgjq.enqueue_many('qb', ARRAY[['{}'], ['{}']]::jsonb[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', '{}']::jsonb[], fair_keys => ARRAY[['a'], ['b']]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(ARRAY[[:run_id]]::bigint[], ARRAY[[:run_token]]::bigint[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.retry_dead('qb', ARRAY[[1]]::bigint[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- ids and tokens must match
SELECT pgjq.complete(ARRAY[:run_id]::bigint[], '{}'::bigint[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- empty arrays are fine and do nothing
SELECT count(*) AS ids FROM pgjq.enqueue_many('qb', '{}'::jsonb[], fair_keys => '{}', dedup_keys => '{}');
SELECT pgjq.complete('{}'::bigint[], '{}'::bigint[]) AS completed;
SELECT pgjq.retry_dead('qb', '{}') AS redriven;
SELECT regress.unchanged();
-- too many elements in one call: 54000
SELECT count(*) FROM pgjq.enqueue_many('qb', array_fill('{}'::jsonb, ARRAY[100001]));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.complete(array_fill(1::bigint, ARRAY[100001]), array_fill(1::bigint, ARRAY[100001]));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();

---------------------------------------------------------------- batch
SELECT count(*) FROM pgjq.claim('qb', 0);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('qb', -1);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('qb', 1000000);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('qb', -2147483648);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();

---------------------------------------------------------------- intervals
-- negative and absurd intervals: 22023, never an overflow or an internal error
SELECT pgjq.enqueue('qb', delay => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '178000000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '-178000000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '2000000000 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '2562047788 hours');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '1 month -31 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}']::jsonb[], delay => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}']::jsonb[], delay => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', lease => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', lease => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', backoff_base => '1000 years', backoff_max => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', retention => '178000000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.alter_queue('qb', retention => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('qb', lease => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- days * 86400000000 past 2^63 wraps: 213503983 days would read as about 16 h
SELECT count(*) FROM pgjq.claim('qb', lease => '213503983 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', lease => '213503983 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', lease => '7116799 months');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', delay => '-213503983 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.heartbeat(:run_id, :run_token, extend => '106751992 days');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.heartbeat(:run_id, :run_token, extend => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.heartbeat(:run_id, :run_token, extend => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.fail(:run_id, :run_token, 'x', retry_in => '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.fail(:run_id, :run_token, 'x', retry_in => '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.snooze(:run_id, :run_token, '-1 second');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.snooze(:run_id, :run_token, '1000 years');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- infinite intervals (PostgreSQL 17+): interval_infinity.sql
-- infinite and far run_at values: 22023
SELECT pgjq.enqueue('qb', run_at => 'infinity');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', run_at => '-infinity');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', run_at => '294276-12-31 23:59:59+00');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}']::jsonb[], run_at => 'infinity');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- a run_at long past is simply due
SELECT pgjq.enqueue('qb', run_at => '4713-01-01 00:00:00+00 BC') AS b_past \gset
SELECT state FROM pgjq.job(:b_past);
SELECT pgjq.cancel(:b_past);
SELECT regress.rebase() IS NOT NULL AS rebased;

---------------------------------------------------------------- queue names
-- 1 to 128 characters from [A-Za-z0-9_.:-]; anything else is 22023, checked
-- before the queue is looked up (so never 42704 for an invalid name)
SELECT pgjq.create_queue('');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('it''s');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('"quoted"');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('a;DROP SCHEMA pgjq CASCADE');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('with space');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue(E'new\nline');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('café');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('队列');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('100%');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('a/b');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue(repeat('q', 500));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue(repeat('q', 129));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('it''s');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('a;b', ARRAY['{}']::jsonb[]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('队列');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.drop_queue(repeat('q', 500));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.alter_queue('', lease => '1 minute');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.pause('a b');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.resume('a b');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.purge('a b');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.retry_dead('a b');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- a valid name that does not exist is 42704
SELECT pgjq.enqueue('no-such-queue');
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- the whole alphabet and the longest name are accepted
SELECT pgjq.create_queue('Az09_-.:x');
SELECT pgjq.create_queue(repeat('q', 128));
SELECT queue FROM pgjq.list_queues() WHERE queue LIKE 'Az%' OR length(queue) = 128 ORDER BY queue;
SELECT pgjq.drop_queue('Az09_-.:x');
SELECT pgjq.drop_queue(repeat('q', 128));
SELECT regress.unchanged();

---------------------------------------------------------------- payloads
-- a 20 MB payload is over pgjq.max_payload_size (1 MB by default): 54000
SELECT pgjq.enqueue('qb', jsonb_build_object('blob', repeat('x', 20 * 1024 * 1024)));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', jsonb_build_object('blob', repeat('x', 20 * 1024 * 1024))]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- the limit is on the payload's size, however well it compresses; just
-- below it is fine
SELECT pgjq.enqueue('qb', jsonb_build_object('blob', repeat('x', 1000 * 1000))) AS b_big \gset
SELECT octet_length(payload->>'blob') AS blob_bytes FROM pgjq.job(:b_big);
SELECT pgjq.cancel(:b_big);
-- the limit is a setting
SET pgjq.max_payload_size = '1kB';
SELECT pgjq.enqueue('qb', jsonb_build_object('blob', repeat('x', 2000)));
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.enqueue('qb', jsonb_build_object('blob', repeat('x', 500))) AS b_small \gset
SELECT pgjq.cancel(:b_small);
RESET pgjq.max_payload_size;
SELECT regress.rebase() IS NOT NULL AS rebased;
-- any JSON value is a payload, not only objects (documented): arrays,
-- strings, numbers, booleans and JSON null are stored as given
CREATE TEMP TABLE odd AS
	SELECT v.payload AS given, pgjq.enqueue('qb', v.payload) AS id
	  FROM (VALUES ('[]'::jsonb), ('[1, "two"]'), ('"text"'), ('42'), ('true'), ('null'), ('{}')) v(payload);
SELECT o.given, j.payload, j.payload = o.given AS same
  FROM odd o CROSS JOIN LATERAL pgjq.job(o.id) j ORDER BY o.id;
SELECT count(*) FILTER (WHERE pgjq.cancel(id)) AS cancelled FROM odd;
SELECT regress.rebase() IS NOT NULL AS rebased;

---------------------------------------------------------------- keys and texts
-- fair_key and dedup_key: at most 512 bytes; worker: at most 256 bytes
SELECT pgjq.enqueue('qb', fair_key => repeat('f', 513));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', dedup_key => repeat('d', 513));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- bytes, not characters: 257 two-byte characters are 514 bytes
SELECT pgjq.enqueue('qb', fair_key => repeat('é', 257));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', '{}']::jsonb[], fair_keys => ARRAY['ok', repeat('f', 513)]);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}', '{}']::jsonb[], dedup_keys => ARRAY[repeat('d', 513), 'ok']);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT count(*) FROM pgjq.claim('qb', worker => repeat('w', 257));
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- the limits themselves are accepted
SELECT pgjq.enqueue('qb', fair_key => repeat('f', 512), dedup_key => repeat('é', 256)) AS b_keys \gset
SELECT octet_length(fair_key) AS fair_key_bytes, octet_length(dedup_key) AS dedup_key_bytes
  FROM pgjq.job(:b_keys);
SELECT id = :b_keys AS is_b_keys, token AS b_keys_token
  FROM pgjq.claim('qb', worker => repeat('w', 256)) \gset
SELECT :'is_b_keys' AS is_b_keys, octet_length(worker) AS worker_bytes FROM pgjq.job(:b_keys);
-- a long error text is clipped to 8192 bytes, on a character boundary
SELECT pgjq.fail(:b_keys, :b_keys_token, repeat('e', 10000), retry_in => '0');
SELECT octet_length(last_error) AS error_bytes, last_error = repeat('e', 8192) AS prefix_kept
  FROM pgjq.job(:b_keys);
SELECT pgjq.promote() AS promoted;
SELECT token AS b_keys_token FROM pgjq.claim('qb') \gset
SELECT pgjq.fail(:b_keys, :b_keys_token, repeat('€', 3000), retry_in => '0');
SELECT octet_length(last_error) AS error_bytes, length(last_error) AS error_chars,
       last_error = repeat('€', 2730) AS whole_characters
  FROM pgjq.job(:b_keys);
SELECT pgjq.cancel(:b_keys);
SELECT regress.rebase() IS NOT NULL AS rebased;

---------------------------------------------------------------- other numbers
-- priority is a smallint's range, given as any integer
SELECT pgjq.enqueue('qb', priority => 32768);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', priority => -32769);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue_many('qb', ARRAY['{}']::jsonb[], priority => 100000);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', max_attempts => 0);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.enqueue('qb', max_attempts => -2147483648);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.create_queue('qb_bad', max_attempts => 2147483647);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
SELECT pgjq.alter_queue('qb', max_attempts => -1);
SELECT :'SQLSTATE' AS sqlstate, regress.unchanged();
-- ids and tokens of any value are just stale
SELECT pgjq.complete(-9223372036854775808, 9223372036854775807) AS complete,
       pgjq.fail(0, 0) AS fail,
       pgjq.heartbeat(9223372036854775807, -1) IS NULL AS heartbeat_null,
       pgjq.snooze(-1, -1, '0') AS snooze,
       pgjq.cancel(-9223372036854775808) AS cancel;
SELECT regress.unchanged();

-- the running job of the start is untouched by all of the above
SELECT state, attempt FROM pgjq.job(:run_id);
SELECT pgjq.complete(:run_id, :run_token);

SELECT pgjq.drop_queue('qb', force => true);
DROP FUNCTION regress.rebase();
DROP FUNCTION regress.unchanged();
DROP FUNCTION regress.snapshot_api();
DROP TABLE regress.baseline;
