--
-- ring: the ring engine, which holds every queue's jobs that are due: the
-- jobs' bodies in pgjq.ring_body_N, their claims and outcomes in
-- pgjq.ring_log_N and in shared memory; a retry or a snooze waits in
-- pgjq.job until promotion appends it to the ring again.
--
\set VERBOSITY terse

-- the earlier test files' queues are on the ring too: what this file counts
-- in the ring's tables is what it wrote after this token
SELECT coalesce(max(token), 0) AS tok0
  FROM (SELECT token FROM pgjq.ring_log_0 UNION ALL SELECT token FROM pgjq.ring_log_1
        UNION ALL SELECT token FROM pgjq.ring_log_2 UNION ALL SELECT token FROM pgjq.ring_log_3) l \gset

SELECT pgjq.create_queue('rq', backoff_base => '10 seconds', max_attempts => 2);

-- a key limit works: at most two running jobs per fair key, counted over
-- the ring (a retried job waits in pgjq.job until promotion appends it)
SELECT pgjq.create_queue('rq_limited', key_concurrency => 2, backoff_base => '0 s');
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq_limited', array_fill('{}'::jsonb, ARRAY[7]),
       fair_keys => ARRAY['a', 'a', 'a', 'a', 'b', 'b', 'b']);
CREATE TEMP TABLE klim AS SELECT id, token, fair_key FROM pgjq.claim('rq_limited', 10);
SELECT fair_key, count(*) FROM klim GROUP BY 1 ORDER BY 1;
-- both keys full: nothing more, and the claim counts as held back
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('rq_limited', 10);
SELECT ready, running, held_back > 0 AS held_back FROM pgjq.queue_stats WHERE queue = 'rq_limited';
-- a completion of an 'a' frees one place for 'a' (its lane was parked)
SELECT pgjq.complete(id, token) AS completed FROM klim WHERE fair_key = 'a' ORDER BY id LIMIT 1;
DELETE FROM klim WHERE id = (SELECT min(id) FROM klim WHERE fair_key = 'a');
INSERT INTO klim SELECT id, token, fair_key FROM pgjq.claim('rq_limited', 10);
SELECT fair_key, count(*) FROM klim GROUP BY 1 ORDER BY 1;
-- a completion that rolls back frees nothing
BEGIN;
SELECT pgjq.complete(id, token) AS completed FROM klim WHERE fair_key = 'b' ORDER BY id LIMIT 1;
ROLLBACK;
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('rq_limited', 10);
-- a failed attempt goes to pgjq.job, due at once (backoff 0); promoted, it
-- is back in the ring as the job's next version (attempt 2, its last error
-- kept), behind its key's ready job: that one takes the key's free place
SELECT id AS retried FROM klim WHERE fair_key = 'b' ORDER BY id LIMIT 1 \gset
SELECT pgjq.fail(id, token, 'boom') AS failed FROM klim WHERE fair_key = 'b' ORDER BY id LIMIT 1;
DELETE FROM klim WHERE id = (SELECT min(id) FROM klim WHERE fair_key = 'b');
SELECT pgjq.promote() AS promoted;
SELECT count(*) AS table_rows FROM pgjq.job WHERE id = :retried;
SELECT state, attempt, last_error FROM pgjq.job(:retried);
INSERT INTO klim SELECT id, token, fair_key FROM pgjq.claim('rq_limited', 10);
SELECT k.fair_key, j.attempt FROM klim k, pgjq.job(k.id) j ORDER BY 1, 2;
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('rq_limited', 10);
-- the counters agree with both stores, per key
SELECT * FROM pgjq.verify();
SELECT count(*) AS completed FROM klim, pgjq.complete(klim.id, klim.token) ok WHERE ok;
SELECT fair_key, count(*), count(*) FILTER (WHERE id = :retried AND attempt = 2) AS the_retry
  FROM pgjq.claim('rq_limited', 10) GROUP BY 1 ORDER BY 1;
SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rq_limited', force => true);
-- a key limit added to a ring queue with running jobs counts them
SELECT pgjq.create_queue('rq_later');
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq_later', array_fill('{}'::jsonb, ARRAY[4]),
       fair_keys => ARRAY['a', 'a', 'a', 'b']);
SELECT count(*) AS claimed FROM pgjq.claim('rq_later', 2);
SELECT pgjq.alter_queue('rq_later', key_concurrency => 2);
SELECT fair_key, count(*) FROM pgjq.claim('rq_later', 10) GROUP BY 1 ORDER BY 1;
SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rq_later', force => true);
-- a rate limit works: a bucket of 2, refilled once in 1000 s
SELECT pgjq.create_queue('rq_rate', rate => 0.001, burst => 2);
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq_rate', array_fill('{}'::jsonb, ARRAY[5]));
SELECT count(*) AS claimed FROM pgjq.claim('rq_rate', 10);
SELECT count(*) AS claimed_again FROM pgjq.claim('rq_rate', 10);
SELECT ready, running, held_back > 0 AS held_back FROM pgjq.queue_stats WHERE queue = 'rq_rate';
SELECT pgjq.drop_queue('rq_rate', force => true);
-- a concurrency limit works: ring jobs count as running until they end
SELECT pgjq.create_queue('rq_conc', concurrency => 2);
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq_conc', array_fill('{}'::jsonb, ARRAY[5]));
CREATE TEMP TABLE conc AS SELECT id, token FROM pgjq.claim('rq_conc', 10);
SELECT count(*) AS claimed FROM conc;
SELECT count(*) AS claimed_at_limit FROM pgjq.claim('rq_conc', 10);
SELECT pgjq.complete(id, token) AS completed FROM conc ORDER BY id LIMIT 1;
SELECT count(*) AS claimed_after_one_ended FROM pgjq.claim('rq_conc', 10);
-- a failed ring job stops counting once it is retried
SELECT pgjq.fail(id, token, 'boom') AS failed FROM conc ORDER BY id DESC LIMIT 1;
SELECT count(*) AS claimed_after_fail FROM pgjq.claim('rq_conc', 10);
SELECT running FROM pgjq.queue_stats WHERE queue = 'rq_conc';
SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rq_conc', force => true);
DROP TABLE conc;

---------------------------------------------------------------- enqueue, claim
-- bodies are appended once; nothing is in pgjq.job
SELECT pgjq.enqueue('rq', '{"n": 1}') AS j1 \gset
SELECT array_agg(id ORDER BY id) AS many
  FROM pgjq.enqueue_many('rq', ARRAY['{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[],
                         fair_keys => ARRAY['a', 'b', 'a']) AS id \gset
SELECT pgjq.enqueue('rq', '{"n": 5}', priority => -1) AS urgent \gset
SELECT count(*) AS table_rows FROM pgjq.job WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'rq');
SELECT count(*) AS bodies FROM pgjq.ring_body_0 WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'rq');
SELECT regress.counts('rq');
SELECT state, attempt, max_attempts, payload FROM pgjq.job(:j1);

-- the most urgent priority first, then one job per fair key per turn
CREATE TEMP TABLE held AS
SELECT c.*, o AS ord FROM pgjq.claim('rq', 3, worker => 'w-first') WITH ORDINALITY AS c(id, token, attempt, payload, fair_key, priority, enqueued_at, lease_until, o);
SELECT ord, payload->>'n' AS n, fair_key, priority, attempt FROM held ORDER BY ord;
INSERT INTO held
SELECT c.*, 3 + o FROM pgjq.claim('rq', 5) WITH ORDINALITY AS c(id, token, attempt, payload, fair_key, priority, enqueued_at, lease_until, o);
SELECT ord, payload->>'n' AS n FROM held WHERE ord > 3 ORDER BY ord;
SELECT count(DISTINCT token) AS tokens, count(*) AS jobs FROM held;
SELECT count(*) AS nothing_left FROM pgjq.claim('rq', 5);
SELECT regress.counts('rq');
SELECT id AS last, token AS tok FROM held WHERE ord = 5 \gset
SELECT state, lease_until > now() AS leased FROM pgjq.job(:last);
-- a REPEATABLE READ transaction reads them from the ring's tables, as of its
-- snapshot (ring_snapshot.spec): the same answers, worker or none
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT h.ord, j.state, j.worker, j.lease_until = h.lease_until AS same_lease
  FROM held h, pgjq.job(h.id) j WHERE h.ord IN (1, 5) ORDER BY h.ord;
COMMIT;

-- each claim call wrote one log row with its token, lease and ids
SELECT kind, cardinality(ids) AS jobs FROM pgjq.ring_log_0 WHERE token > :tok0 ORDER BY token, ctid;

---------------------------------------------------------------- complete
SELECT pgjq.complete(:last, :tok) AS completed;
SELECT pgjq.complete(:last, :tok) AS again;
SELECT pgjq.complete(:last, :tok + 1000) AS wrong_token;
SELECT state, attempt FROM pgjq.job(:last);
SELECT regress.counts('rq');

-- complete_and_claim: completes the first, a stale pair changes nothing
SELECT pgjq.enqueue('rq', '{"n": 6}') AS j6 \gset
SELECT id AS h1, token AS t1 FROM held WHERE ord = 1 \gset
SELECT id = :j6 AS claimed_j6, token AS j6_tok
  FROM pgjq.complete_and_claim('rq', ARRAY[:h1, 424242], ARRAY[:t1, 1], 5) \gset
SELECT :'claimed_j6' AS claimed_j6;
SELECT state FROM pgjq.job(:h1);
SELECT regress.counts('rq');

---------------------------------------------------------------- fail, heartbeat, snooze
SELECT id AS h2, token AS t2 FROM held WHERE ord = 2 \gset
SELECT id AS h3, token AS t3 FROM held WHERE ord = 3 \gset
SELECT id AS h4, token AS t4 FROM held WHERE ord = 4 \gset
-- fail closes the claim (one 'f' log row) and writes the retry once, as a
-- scheduled row of pgjq.job (with the claim's token: promotion appends it
-- to the ring again after that claim); a rollback changes nothing
BEGIN;
SELECT pgjq.fail(:h2, :t2, 'rolled back') AS fail;
ROLLBACK;
SELECT state, attempt, last_error FROM pgjq.job(:h2);
SELECT pgjq.fail(:h2, :t2, 'boom') AS fail;
SELECT state, attempt, last_error FROM pgjq.job(:h2);
SELECT state, attempt, token = :t2 AS claims_token, lease_until, last_error
  FROM pgjq.job WHERE id = :h2;
SELECT pgjq.fail(:h2, :t2, 'again') AS stale_fail;
SELECT pgjq.heartbeat(:h2, :t2) IS NULL AS stale_heartbeat;
-- attempts spent: dead, in the history with its payload and worker
SELECT pgjq.create_queue('rq_once', max_attempts => 1);
SELECT pgjq.enqueue('rq_once', '{"n": "once"}', fair_key => 'k') AS once \gset
SELECT token AS once_tok FROM pgjq.claim('rq_once', 1, worker => 'w-once') \gset
SELECT pgjq.fail(:once, :once_tok, 'fatal') AS fail;
SELECT state, attempt, last_error, worker, payload, fair_key FROM pgjq.job(:once);
SELECT count(*) AS in_pgjq_job FROM pgjq.job WHERE id = :once;
SELECT pgjq.retry_dead('rq_once') AS redriven;
SELECT state, attempt FROM pgjq.job(:once);
-- a rescued ring lease: the same as a failure with 'lease expired'
SELECT pgjq.enqueue('rq_once', '{"n": "rescued"}') AS resc \gset
SELECT count(*) AS claimed FROM pgjq.claim('rq_once', 10, lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT pgjq.rescue() AS rescued;
SELECT state, attempt, last_error FROM pgjq.job(:resc);
SELECT state, attempt, last_error FROM pgjq.job(:once);
SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rq_once');
-- heartbeat: the job stays in the ring (one 'h' log row, nothing moved),
-- with its worker and the longer lease
SELECT worker AS worker_before FROM pgjq.job(:h3);
SELECT pgjq.heartbeat(:h3, :t3, '1 hour')
       > now() + interval '59 minutes' AS extended;
SELECT pgjq.heartbeat(:h3, :t3 + 1000) IS NULL AS stale_heartbeat;
SELECT state, lease_until > now() + interval '59 minutes' AS extended, worker FROM pgjq.job(:h3);
SELECT count(*) AS in_pgjq_job FROM pgjq.job WHERE id = :h3;
SELECT count(*) AS h_rows
  FROM (SELECT kind, ids FROM pgjq.ring_log_0 UNION ALL SELECT kind, ids FROM pgjq.ring_log_1
        UNION ALL SELECT kind, ids FROM pgjq.ring_log_2 UNION ALL SELECT kind, ids FROM pgjq.ring_log_3) l
 WHERE kind = 'h' AND :h3 = ANY (ids);
-- a heartbeat that rolls back (whole or to a savepoint) leaves the lease
-- as it was; a later one in the same transaction wins
BEGIN;
SELECT pgjq.heartbeat(:h3, :t3, '3 hours') > now() + interval '179 minutes' AS extended;
ROLLBACK;
SELECT lease_until < now() + interval '61 minutes' AS as_before FROM pgjq.job(:h3);
BEGIN;
SELECT pgjq.heartbeat(:h3, :t3, '2 hours') IS NOT NULL AS extended;
SAVEPOINT s;
SELECT pgjq.heartbeat(:h3, :t3, '5 hours') IS NOT NULL AS extended;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT lease_until BETWEEN now() + interval '119 minutes' AND now() + interval '121 minutes'
       AS two_hours FROM pgjq.job(:h3);
BEGIN;
SELECT pgjq.heartbeat(:h3, :t3, '1 minute') IS NOT NULL AS shortened;
SELECT pgjq.heartbeat(:h3, :t3, '30 minutes') IS NOT NULL AS extended;
COMMIT;
SELECT lease_until BETWEEN now() + interval '29 minutes' AND now() + interval '31 minutes'
       AS the_last_wins FROM pgjq.job(:h3);
SELECT * FROM pgjq.verify();
-- heartbeat and complete in one transaction; a rollback of both keeps the claim
BEGIN;
SELECT pgjq.heartbeat(:h3, :t3, '1 hour') IS NOT NULL AS extended;
SELECT pgjq.complete(:h3, :t3) AS completed;
ROLLBACK;
SELECT state FROM pgjq.job(:h3);
BEGIN;
SELECT pgjq.heartbeat(:h3, :t3, '1 hour') IS NOT NULL AS extended;
SAVEPOINT s;
SELECT pgjq.complete(:h3, :t3) AS completed;
ROLLBACK TO SAVEPOINT s;
SELECT pgjq.complete(:h3, :t3) AS completed_after_savepoint;
COMMIT;
SELECT state FROM pgjq.job(:h3);
SELECT pgjq.heartbeat(:h3, :t3) IS NULL AS heartbeat_after_complete;
-- a claim and its heartbeat in one transaction: the heartbeat's lease
SELECT pgjq.enqueue('rq', '{"n": "claim and heartbeat"}') AS hb \gset
BEGIN;
SELECT id = :hb AS claimed, token AS hb_tok FROM pgjq.claim('rq', 1, lease => '1 minute') \gset
SELECT :'claimed' AS claimed;
SELECT pgjq.heartbeat(:hb, :hb_tok, '3 hours') IS NOT NULL AS extended;
COMMIT;
SELECT state, lease_until > now() + interval '179 minutes' AS three_hours FROM pgjq.job(:hb);
SELECT pgjq.complete(:hb, :hb_tok) AS completed;
SELECT * FROM pgjq.verify();
-- snooze: scheduled in pgjq.job (written once, no running row), the
-- attempt given back
SELECT pgjq.snooze(:h4, :t4, '1 hour') AS snoozed;
SELECT state, attempt FROM pgjq.job(:h4);
SELECT regress.counts('rq');

---------------------------------------------------------------- cancel
-- a ready ring job is cancelled at once
SELECT pgjq.enqueue('rq', '{"n": 7}') AS j7 \gset
SELECT pgjq.cancel(:j7) AS cancelled;
SELECT state FROM pgjq.job(:j7);
-- so is one enqueued in the same transaction (not published yet), in the
-- same statement too; a rollback takes both back
SELECT pgjq.cancel(pgjq.enqueue('rq', '{"n": "same statement"}')) AS cancelled;
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "same transaction"}') AS j8 \gset
SELECT pgjq.cancel(:j8) AS cancelled;
SELECT state FROM pgjq.job(:j8);
SELECT count(*) AS claimed FROM pgjq.claim('rq', 10) WHERE id = :j8;
ROLLBACK;
SELECT count(*) AS after_rollback FROM pgjq.job(:j8);
SELECT * FROM pgjq.verify();
-- a running one gets its cancellation requested, in the ring (one 'q' log
-- row); a rollback takes the request back; its holder's completion ends it
-- as cancelled
BEGIN;
SELECT pgjq.cancel(:j6) AS requested;
SELECT state, cancel_requested FROM pgjq.job(:j6);
ROLLBACK;
SELECT state, cancel_requested FROM pgjq.job(:j6);
SELECT pgjq.cancel(:j6) AS requested;
SELECT pgjq.cancel(:j6) AS requested_again;
SELECT state, cancel_requested FROM pgjq.job(:j6);
SELECT count(*) AS in_pgjq_job FROM pgjq.job WHERE id = :j6;
SELECT pgjq.complete(:j6, :j6_tok) AS complete_of_cancelled;
SELECT state, attempt, worker FROM pgjq.job(:j6);
-- so do its holder's heartbeat (NULL), fail and snooze (stale)
SELECT min(id) AS c1, max(id) AS c3
  FROM pgjq.enqueue_many('rq', ARRAY['{"n": "c1"}', '{"n": "c2"}', '{"n": "c3"}']::jsonb[]) id \gset
CREATE TEMP TABLE cx AS SELECT id, token FROM pgjq.claim('rq', 3, worker => 'w-cx');
SELECT count(*) AS requested FROM cx, pgjq.cancel(cx.id) r WHERE r;
SELECT pgjq.heartbeat(id, token) IS NULL AS heartbeat FROM cx WHERE id = :c1;
SELECT pgjq.fail(id, token, 'failed anyway') AS fail FROM cx WHERE id = :c1 + 1;
SELECT pgjq.snooze(id, token, '1 hour') AS snooze FROM cx WHERE id = :c3;
SELECT j.id - :c1 AS job, j.state, j.attempt, j.last_error, j.worker
  FROM cx, pgjq.job(cx.id) j ORDER BY 1;
SELECT count(*) AS in_pgjq_job FROM pgjq.job WHERE id BETWEEN :c1 AND :c3;
SELECT * FROM pgjq.verify();
SELECT regress.counts('rq');

-- what the outcomes write to pgjq.job: a
-- heartbeat and the cancel of a ready job nothing, a failure its retry's row
SELECT min(id) AS w1, max(id) AS w2
  FROM pgjq.enqueue_many('rq', ARRAY['{"n": "w1"}', '{"n": "w2"}']::jsonb[]) id \gset
SELECT id = :w1 AS claimed_w1, token AS w1_tok FROM pgjq.claim('rq', 1) \gset
SELECT :'claimed_w1' AS claimed_w1;
-- (the pending counts of earlier transactions are flushed first)
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT pgjq.heartbeat(:w1, :w1_tok, '1 hour') IS NOT NULL AS extended;
SELECT pgjq.cancel(:w2) AS cancelled;
SELECT pgjq.fail(:w1, :w1_tok, 'boom') AS fail;
SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables
 WHERE relid = 'pgjq.job'::regclass;
COMMIT;
SELECT state, attempt, payload FROM pgjq.job(:w2);
SELECT regress.counts('rq');

---------------------------------------------------------------- delayed jobs, dedup anchors
-- a delayed job waits in pgjq.job until promotion appends it to the ring; a
-- job with a dedup_key is the ring's too, and holds its key with an anchor
-- row in pgjq.job (state 'n': same id and key, no payload)
SELECT pgjq.enqueue('rq', '{"n": "delayed"}', delay => '1 hour') AS delayed \gset
SELECT pgjq.enqueue('rq', '{"n": "dedup"}', dedup_key => 'k') AS dedup \gset
SELECT pgjq.enqueue('rq', '{"n": "dedup again"}', dedup_key => 'k') = :dedup AS deduplicated;
SELECT state, dedup_key, payload FROM pgjq.job(:dedup);
SELECT id = :dedup AS is_dedup, state, dedup_key, payload FROM pgjq.job
 WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'rq') ORDER BY id;
-- in one enqueue_many: a duplicate of an existing job, one of an earlier
-- position, and a job without a key, which writes no anchor
SELECT array_length(a, 1) AS n, a[1] = :dedup AS first_is_existing, a[2] = a[3] AS same_key_same_id,
       a[4] <> ALL (a[1:3]) AS no_key_new
  FROM (SELECT ARRAY(SELECT pgjq.enqueue_many('rq', ARRAY['{"n": "d1"}', '{"n": "d2"}', '{"n": "d2 again"}', '{"n": "no key"}']::jsonb[],
                                            dedup_keys => ARRAY['k', 'k2', 'k2', NULL])) AS a) e;
SELECT state, count(*) FROM pgjq.job WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'rq')
 GROUP BY state ORDER BY state;
SELECT state FROM pgjq.job(:delayed);
-- a rolled-back enqueue leaves neither a ring job nor an anchor
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "gone"}', dedup_key => 'k-gone') AS gone \gset
ROLLBACK;
SELECT count(*) AS gone FROM pgjq.job(:gone);
SELECT pgjq.enqueue('rq', '{"n": "gone, again"}', dedup_key => 'k-gone') <> :gone AS new_id;
CREATE TEMP TABLE held2 AS SELECT * FROM pgjq.claim('rq', 10);
SELECT payload->>'n' AS n, attempt FROM held2 ORDER BY id;
-- a retry keeps the key: its anchor becomes the scheduled row, and back at
-- promotion; a duplicate meanwhile gets the job's id
SELECT id AS dk, token AS dk_tok FROM held2 WHERE id = :dedup \gset
SELECT pgjq.fail(:dk, :dk_tok, 'once', retry_in => '0') AS fail;
SELECT state, dedup_key FROM pgjq.job WHERE id = :dk;
SELECT pgjq.enqueue('rq', '{"n": "dup while scheduled"}', dedup_key => 'k') = :dk AS deduplicated;
SELECT pgjq.promote() AS promoted;
SELECT state, dedup_key, payload FROM pgjq.job WHERE id = :dk;
SELECT state, attempt, dedup_key, last_error FROM pgjq.job(:dk);
SELECT id = :dk AS retried, attempt, token AS dk_tok FROM pgjq.claim('rq', 1) \gset
SELECT :'retried' AS retried, :'attempt' AS attempt;
-- completing ends the anchors (and the keys are free again)
SELECT count(*) FILTER (WHERE ok) AS completed
  FROM (SELECT pgjq.complete(id, token) AS ok FROM held2 WHERE id <> :dk
        UNION ALL SELECT pgjq.complete(:dk, :dk_tok)) c;
SELECT count(*) AS anchors_left FROM pgjq.job WHERE state = 'n';
SELECT pgjq.enqueue('rq', '{"n": "k again"}', dedup_key => 'k', max_attempts => 1) <> :dk AS new_job;
-- dead ends it too (the history keeps the key), and a cancel of a ready job
SELECT id AS dk, token AS dk_tok FROM pgjq.claim('rq', 1) \gset
SELECT pgjq.fail(:dk, :dk_tok, 'fatal') AS fail;
SELECT state, dedup_key FROM pgjq.job(:dk);
SELECT count(*) AS anchors_left FROM pgjq.job WHERE state = 'n';
SELECT pgjq.enqueue('rq', '{"n": "to cancel"}', dedup_key => 'kc') AS kc \gset
SELECT pgjq.cancel(:kc) AS cancelled;
SELECT state, dedup_key FROM pgjq.job(:kc);
SELECT count(*) AS anchors_left FROM pgjq.job WHERE state = 'n';
-- redriven, the dead job takes its key again and returns to the ring (the
-- next claim moves it there from pgjq.job)
SELECT pgjq.retry_dead('rq', ARRAY[:dk]) AS redriven;
SELECT state, dedup_key FROM pgjq.job WHERE id = :dk;
SELECT id = :dk AS redriven_claimed, attempt, token AS dk_tok FROM pgjq.claim('rq', 1) \gset
SELECT :'redriven_claimed' AS redriven_claimed, :'attempt' AS attempt;
SELECT state, dedup_key FROM pgjq.job WHERE id = :dk;
SELECT pgjq.complete(:dk, :dk_tok) AS completed;
SELECT count(*) AS anchors_left FROM pgjq.job WHERE state = 'n';
SELECT * FROM pgjq.verify();
SELECT regress.counts('rq');

---------------------------------------------------------------- transactions
-- a producer's jobs are claimable by others when it commits (ring_race.spec);
-- a claim in the same transaction sees them, as on pgjq.job
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "own"}') AS own \gset
SELECT payload->>'n' AS n, token AS own_tok FROM pgjq.claim('rq', 5) \gset
SELECT :'n' AS own_claimed;
COMMIT;
SELECT state FROM pgjq.job(:own);
-- enqueued, claimed and completed in one transaction
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "all in one"}') AS aio \gset
SELECT id = :aio AS same, pgjq.complete(id, token) AS completed FROM pgjq.claim('rq', 5);
COMMIT;
SELECT state FROM pgjq.job(:aio);
-- enqueued and claimed in a transaction that rolls back: gone
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "never"}') IS NOT NULL AS enqueued;
SELECT count(*) AS claimed FROM pgjq.claim('rq', 5);
ROLLBACK;
SELECT count(*) AS nothing_claimable FROM pgjq.claim('rq', 5);
-- a claim of its own job rolled back to a savepoint: the job is published
-- at commit as if never claimed
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "savepoint"}') AS sp \gset
SAVEPOINT a;
SELECT count(*) AS claimed FROM pgjq.claim('rq', 5);
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT state FROM pgjq.job(:sp);
SELECT id = :sp AS same, pgjq.complete(id, token) AS completed FROM pgjq.claim('rq', 5);
SELECT * FROM pgjq.verify();
-- a rolled-back savepoint: its jobs are never published, its claims and
-- completions undone
BEGIN;
SAVEPOINT s;
SELECT pgjq.enqueue('rq', '{"n": "rolled back"}') IS NOT NULL AS enqueued;
ROLLBACK TO SAVEPOINT s;
SELECT pgjq.complete(:own, :own_tok) AS completed_in_tx;
SAVEPOINT t;
SELECT pgjq.enqueue('rq', '{"n": "kept"}') IS NOT NULL AS enqueued;
RELEASE SAVEPOINT t;
ROLLBACK;
SELECT state FROM pgjq.job(:own);
SELECT count(*) AS claimable FROM pgjq.claim('rq', 5);
SELECT pgjq.complete(:own, :own_tok) AS completed;
-- a claim and its completion in one transaction
SELECT pgjq.enqueue('rq', '{"n": "one tx"}') AS onetx \gset
BEGIN;
SELECT pgjq.complete(id, token) AS completed FROM pgjq.claim('rq', 1);
COMMIT;
SELECT state FROM pgjq.job(:onetx);
-- two-phase commit is refused, as for NOTIFY
BEGIN;
SELECT pgjq.enqueue('rq', '{"n": "2pc"}') IS NOT NULL AS enqueued;
PREPARE TRANSACTION 'ring2pc';
\echo :SQLSTATE
SELECT regress.counts('rq');

---------------------------------------------------------------- space back by TRUNCATE
-- with two bodies per slot, producers move on and finished slots are emptied
-- (a slot still holding a running job would keep the ring from moving on)
SELECT pgjq.complete(array_agg(id), array_agg(token)) AS completed FROM held2;
SET pgjq.ring_slot_rows = 2;
SELECT pgjq.enqueue_many('rq', ARRAY['{}', '{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pgjq.enqueue_many('rq', ARRAY['{}', '{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pgjq.enqueue_many('rq', ARRAY['{}', '{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
RESET pgjq.ring_slot_rows;
-- every slot but the current one is empty again: bodies and log rows gone
SELECT count(*) FILTER (WHERE pg_relation_size(c.oid) = 0) >= 3 AS slots_truncated
  FROM pg_class c
 WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relname LIKE 'ring\_body\__';
-- the hot path never updates or deletes a row of the ring's tables (their
-- dead tuples come only from rolled-back inserts, here and in earlier files)
CREATE FUNCTION regress.ring_changed(OUT changed bigint, OUT inserted bigint) LANGUAGE sql AS $$
	SELECT sum(n_tup_upd + n_tup_del)::bigint, sum(n_tup_ins)::bigint FROM pg_stat_user_tables
	 WHERE schemaname = 'pgjq' AND relname ~ '^ring_(body|log)_\d$'
$$;
SELECT pg_stat_force_next_flush();
SELECT changed AS changed0, inserted AS inserted0 FROM regress.ring_changed() \gset
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[50]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 50) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pg_stat_force_next_flush();
SELECT pg_stat_clear_snapshot();
SELECT changed - :changed0 AS rows_updated_or_deleted, inserted - :inserted0 >= 52 AS rows_inserted
  FROM regress.ring_changed();
-- shared memory agrees with the ring's tables
SELECT * FROM pgjq.verify();
-- and verify() says so when they do not: a forged log row that closes a
-- ready job (the tables now call it finished, shared memory still ready),
-- written into slot 0, which shared memory knows to be clean
SELECT pgjq.enqueue('rq', '{"n": "forged"}') AS forged \gset
INSERT INTO pgjq.ring_log_0 VALUES (9999999, now(), 'd', ARRAY[:forged]::bigint[]);
-- (the token sequence's value depends on the files before this one)
SELECT area, replace(object, :'forged', 'F') AS object, expected,
       CASE area WHEN 'sequences' THEN 'N' ELSE found END AS found FROM pgjq.verify();
DELETE FROM pgjq.ring_log_0 WHERE token = 9999999;
SELECT * FROM pgjq.verify();

---------------------------------------------------------------- stragglers relocated
-- A slot whose last jobs wait (a slow tenant's ready job, a running job with
-- a long lease) would keep the ring from moving on: once every slot is in
-- use, _ring_reclaim() (the background worker's step) copies them into the
-- current slot, and the old slots are truncated.  Nothing else changes.
CREATE FUNCTION pg_temp.slots_with_bodies() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FILTER (WHERE pg_relation_size(c.oid) > 0) FROM pg_class c
   WHERE c.relnamespace = 'pgjq'::regnamespace AND c.relname LIKE 'ring\_body\__' $$;
SELECT count(*) AS drained FROM pgjq.claim('rq', 100) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pgjq._ring_reclaim(0);
\echo :SQLSTATE
SELECT pgjq.create_queue('rq_slow');
SET pgjq.ring_slot_rows = 4;
-- start from a full current slot and the other three empty
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pgjq._ring_reclaim() <= 1 AS reclaimed;
SELECT pgjq._ring_reclaim() <= 1 AS reclaimed;
SELECT pgjq._ring_reclaim() <= 1 AS reclaimed;
SELECT pg_temp.slots_with_bodies();
-- one slot gets the slow tenant's job and seven others, one of which runs
-- for a day
SELECT pgjq.enqueue('rq_slow', '{"n": "slow"}') AS slow \gset
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{"n": "round 1"}'::jsonb, ARRAY[7]));
SELECT id AS long, token AS long_tok FROM pgjq.claim('rq', 1, lease => '1 day', worker => 'w-long') \gset
-- its heartbeat's 'h' row is written into the current slot, its claim row
-- stays in the oldest: the relocation writes that one again, with the lease
SELECT pgjq.heartbeat(:long, :long_tok, '2 days') IS NOT NULL AS extended;
-- and its cancellation is requested: the 'q' row is written again too
-- (verify() compares the request in shared memory with the rows)
SELECT pgjq.cancel(:long) AS cancel_requested;
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
-- every slot is in use now; the producers' next slot holds the stragglers
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('rq', array_fill('{}'::jsonb, ARRAY[4]));
SELECT count(*) AS completed FROM pgjq.claim('rq', 10) c, pgjq.complete(c.id, c.token) ok WHERE ok;
SELECT pg_temp.slots_with_bodies();
-- a relocation that rolls back (whole or to a savepoint) changes nothing
BEGIN;
SELECT pgjq._ring_reclaim() AS relocated;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT pgjq._ring_reclaim() AS relocated;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT * FROM pgjq.verify();
-- the two stragglers are copied, then the three old slots are truncated
SELECT pgjq._ring_reclaim() AS relocated;
SELECT * FROM pgjq.verify();
SELECT pgjq._ring_reclaim() AS truncated;
SELECT pgjq._ring_reclaim() AS truncated;
SELECT pgjq._ring_reclaim() AS truncated;
SELECT pgjq._ring_reclaim() AS nothing_left;
SELECT pg_temp.slots_with_bodies();
RESET pgjq.ring_slot_rows;
SELECT * FROM pgjq.verify();
-- both kept their state: the running one its token, lease and worker (read
-- from the claim row the relocation wrote again: the first one went with its
-- slot), the ready one its place
SELECT state, attempt, lease_until > now() + '47 hours' AS long_lease, worker, cancel_requested
  FROM pgjq.job(:long);
SELECT state FROM pgjq.job(:slow);
SELECT pgjq.heartbeat(:long, :long_tok + 1) AS stale_heartbeat;
SELECT pgjq.complete(:long, :long_tok) AS completed;
SELECT id = :slow AS the_slow_job, payload FROM pgjq.claim('rq_slow', 10) c, pgjq.complete(c.id, c.token) ok;
SELECT state FROM pgjq.job(:long);
SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('rq_slow');

---------------------------------------------------------------- purge, drop
SELECT pgjq.enqueue_many('rq', ARRAY['{}', '{}', '{}']::jsonb[]) IS NOT NULL AS enqueued;
SELECT id AS held, token AS held_tok FROM pgjq.claim('rq', 1) \gset
SELECT pgjq.enqueue('rq', '{}', dedup_key => 'kp') IS NOT NULL AS enqueued;
SELECT pgjq.purge('rq') AS purged;
SELECT count(*) AS anchors_left FROM pgjq.job WHERE state = 'n';
SELECT regress.counts('rq');
-- a running ring job keeps drop_queue from dropping, unless forced
SELECT pgjq.drop_queue('rq');
\echo :SQLSTATE
SELECT count(*) AS still_there FROM pgjq.queue WHERE name = 'rq';
SELECT pgjq.drop_queue('rq', force => true);
SELECT pgjq.complete(:held, :held_tok) AS complete_after_drop;
SELECT count(*) AS ring_counts FROM pgjq._ring_counts();
SELECT * FROM pgjq.verify();
