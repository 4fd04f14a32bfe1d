--
-- ring_priorities: a ring queue holds ready jobs of any number of distinct
-- priorities at once (0.2.0 refused a 33rd with 54000), and a priority whose
-- only job is claimed keeps its ring while the claim is open, so that an
-- aborted claim finds it (0.2.0 evicted it for a new priority: a NULL
-- dereference in the abort callback crashed the server).
--
\set VERBOSITY terse

SELECT pgjq.create_queue('rp');

-- 40 distinct priorities, 2 jobs each: all taken, the smallest first
SELECT count(*) AS enqueued
  FROM generate_series(1, 40) p, LATERAL pgjq.enqueue_many('rp', ARRAY['{}', '{}']::jsonb[], priority => (41 - p) * 100);
SELECT ready FROM pgjq.queue_stats WHERE queue = 'rp';
CREATE TEMP TABLE rp_got AS SELECT id, token, priority, fair_key FROM pgjq.claim('rp', 100);
SELECT count(*) AS claimed, count(DISTINCT priority) AS priorities,
       bool_and(priority = expect) AS in_priority_order
  FROM (SELECT priority, 100 * ((row_number() OVER (ORDER BY ord) + 1) / 2) AS expect
          FROM (SELECT priority, row_number() OVER () AS ord FROM rp_got) o) s;
SELECT count(*) AS completed FROM rp_got, pgjq.complete(id, token) ok WHERE ok;
DROP TABLE rp_got;

-- priorities over the whole documented range, each with a fair key
SELECT count(*) AS enqueued
  FROM generate_series(-32768, 32767, 1024) p,
       LATERAL pgjq.enqueue('rp', '{}', priority => p::int, fair_key => 'k' || (p % 3)) e;
CREATE TEMP TABLE rp_got AS SELECT id, token, priority FROM pgjq.claim('rp', 100);
SELECT count(*) AS claimed, min(priority) AS first_min, max(priority) AS last_max,
       bool_and(priority >= prev) AS ascending
  FROM (SELECT priority, coalesce(lag(priority) OVER (ORDER BY ord), -32768) AS prev
          FROM (SELECT priority, row_number() OVER () AS ord FROM rp_got) o) s;
SELECT count(*) AS completed FROM rp_got, pgjq.complete(id, token) ok WHERE ok;
DROP TABLE rp_got;

-- 0.2.0's H2: 32 priorities; the claim of the most urgent one's last job,
-- then a new priority (its ring took the claimed priority's place), then the
-- claim rolls back: its job goes back to its priority's ring
SELECT count(*) AS enqueued
  FROM generate_series(1, 32) p, LATERAL pgjq.enqueue('rp', '{}', priority => p) e;
BEGIN;
SAVEPOINT s;
SELECT priority AS claimed_priority FROM pgjq.claim('rp', 1);
SELECT count(*) AS enqueued FROM pgjq.enqueue('rp', '{}', priority => 33);
ROLLBACK TO SAVEPOINT s;
COMMIT;
-- the same across transactions: an open claim, a new priority, an abort
BEGIN;
SELECT priority AS claimed_priority FROM pgjq.claim('rp', 1);
SELECT count(*) AS enqueued FROM pgjq.enqueue('rp', '{}', priority => 34);
ROLLBACK;
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'rp';
CREATE TEMP TABLE rp_got AS SELECT id, token, priority FROM pgjq.claim('rp', 100);
SELECT count(*) AS claimed, string_agg(priority::text, ',' ORDER BY priority) FILTER (WHERE priority <= 2 OR priority >= 32) AS ends
  FROM rp_got;
SELECT count(*) AS completed FROM rp_got, pgjq.complete(id, token) ok WHERE ok;
DROP TABLE rp_got;
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'rp';

-- a held key's lane keeps its priority's ring while other priorities come
-- and go (0.2.0 evicted it: released, its job stayed out of every ring)
SELECT count(*) AS enqueued FROM pgjq.enqueue('rp', '{}', priority => 0, fair_key => 'held') e;
SELECT pgjq.hold_key('rp', 'held', now() + interval '1 hour');
SELECT count(*) AS enqueued
  FROM generate_series(1, 31) p, LATERAL pgjq.enqueue('rp', '{}', priority => p) e;
SELECT count(*) AS completed FROM pgjq.claim('rp', 100) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT count(*) AS enqueued
  FROM generate_series(100, 104) p, LATERAL pgjq.enqueue('rp', '{}', priority => p) e;
SELECT pgjq.release_key('rp', 'held') AS released;
CREATE TEMP TABLE rp_got AS SELECT id, token, priority, fair_key FROM pgjq.claim('rp', 100);
SELECT string_agg(priority || coalesce('/' || fair_key, ''), ',' ORDER BY priority) AS claimed FROM rp_got;
SELECT count(*) AS completed FROM rp_got, pgjq.complete(id, token) ok WHERE ok;
DROP TABLE rp_got;

SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rp');
