--
-- two_phase: PREPARE TRANSACTION of a transaction in which pgjq enqueued,
-- claimed or finished a job is refused with feature_not_supported (0A000):
-- the limit counters, the wake-ups of waiting claims and of the worker
-- follow the commit, and cannot follow a COMMIT PREPARED or ROLLBACK
-- PREPARED issued later, possibly from another session or after a restart.
-- The refused transaction is rolled back (nothing is left prepared, no job
-- changed).  A transaction that changed no job prepares, commits and rolls
-- back as usual.  (test/pgjq.conf sets max_prepared_transactions.)
--
\set VERBOSITY terse
-- a transaction prepared by mistake would hold its row locks: fail, not hang
SET lock_timeout = '5s';

SELECT pgjq.create_queue('tp');
SELECT pgjq.create_queue('tpl', concurrency => 5);

-- enqueue a ready job: refused, and the job is not there
BEGIN;
SELECT pgjq.enqueue('tp', '{}') > 0 AS enqueued;
PREPARE TRANSACTION 'pgjq_tp';
\echo :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT ready, scheduled FROM pgjq.queue_stats WHERE queue = 'tp';

-- enqueue a delayed job: refused as well
BEGIN;
SELECT pgjq.enqueue('tp', '{}', delay => '1 hour') > 0 AS enqueued;
PREPARE TRANSACTION 'pgjq_tp';
\echo :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT ready, scheduled FROM pgjq.queue_stats WHERE queue = 'tp';

-- claim: refused, and the job is ready again
SELECT count(*) FROM pgjq.enqueue_many('tpl', array_fill('{}'::jsonb, ARRAY[2]));
BEGIN;
SELECT count(*) AS claimed FROM pgjq.claim('tpl', 1);
PREPARE TRANSACTION 'pgjq_tp';
\echo :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'tpl';
-- the refused claim's reservation was given back: the limit allows 2 now
SELECT count(*) AS claimed FROM pgjq.claim('tpl', 5);

-- claim on a queue without limits: refused too
SELECT pgjq.enqueue('tp', '{}') > 0 AS enqueued;
BEGIN;
SELECT count(*) AS claimed FROM pgjq.claim('tp', 1);
PREPARE TRANSACTION 'pgjq_tp';
\echo :SQLSTATE
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'tp';

-- complete: refused, and the job still runs with a valid token
SELECT id AS c_id, token AS c_token FROM pgjq.claim('tp', 1) \gset
BEGIN;
SELECT pgjq.complete(:c_id, :c_token);
PREPARE TRANSACTION 'pgjq_tp';
\echo :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT state FROM pgjq.job(:c_id);
SELECT pgjq.complete(:c_id, :c_token);

-- a claim that got nothing changed nothing: it prepares
BEGIN;
SELECT count(*) AS claimed FROM pgjq.claim('tp', 1);
PREPARE TRANSACTION 'pgjq_tp_empty';
ROLLBACK PREPARED 'pgjq_tp_empty';

-- alter_queue of a limit wakes waiting claims at commit: refused (README);
-- of another setting: it prepares
BEGIN;
SELECT pgjq.alter_queue('tp', concurrency => 3);
PREPARE TRANSACTION 'pgjq_tp_alter';
\echo :SQLSTATE
SELECT concurrency FROM pgjq.list_queues() WHERE queue = 'tp';
BEGIN;
SELECT pgjq.alter_queue('tp', max_attempts => 7);
PREPARE TRANSACTION 'pgjq_tp_alter';
COMMIT PREPARED 'pgjq_tp_alter';
SELECT max_attempts FROM pgjq.list_queues() WHERE queue = 'tp';

-- without any pgjq call: prepare, then commit or roll back
CREATE TABLE tp_plain (x int);
BEGIN;
INSERT INTO tp_plain VALUES (1);
PREPARE TRANSACTION 'pgjq_tp_commit';
COMMIT PREPARED 'pgjq_tp_commit';
BEGIN;
INSERT INTO tp_plain VALUES (2);
PREPARE TRANSACTION 'pgjq_tp_rollback';
ROLLBACK PREPARED 'pgjq_tp_rollback';
SELECT x FROM tp_plain;
DROP TABLE tp_plain;

-- queue administration changes no job: it prepares
BEGIN;
SELECT pgjq.create_queue('tp_new');
PREPARE TRANSACTION 'pgjq_tp_queue';
COMMIT PREPARED 'pgjq_tp_queue';
SELECT count(*) FROM pgjq.list_queues() WHERE queue = 'tp_new';

SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT pgjq.drop_queue('tp_new');
SELECT pgjq.drop_queue('tp', force => true);
SELECT pgjq.drop_queue('tpl', force => true);
