--
-- queue: create_queue, alter_queue, drop_queue, pause, resume, purge,
-- list_queues.
--
\set VERBOSITY terse

-- list_queues() without created_at (a time)
CREATE VIEW regress.queues AS
	SELECT queue, lease, max_attempts, backoff_base, backoff_max, retention, paused
	  FROM pgjq.list_queues() WHERE queue LIKE 'qq%';

-- defaults: lease 30 s, max_attempts 20, backoff 1 s .. 1 h, retention 1 day
SELECT pgjq.create_queue('qq_default');
SELECT * FROM regress.queues;
SELECT created_at <= now() AS created_at_set FROM pgjq.list_queues() WHERE queue = 'qq_default';

-- positional and named arguments, in any order
SELECT pgjq.create_queue('qq_positional', '5 minutes', 3, '2 seconds', '10 seconds', '2 days');
SELECT pgjq.create_queue(retention => '0', max_attempts => 1, queue => 'qq_named',
                         backoff_max => '0', backoff_base => '0', lease => '1 microsecond');
-- upper bounds are inclusive
SELECT pgjq.create_queue('qq_max', lease => '7 days', max_attempts => 10000,
                         backoff_base => '7 days', backoff_max => '30 days',
                         retention => '3650 days');
-- a backoff_base above the default backoff_max raises that default with it
SELECT pgjq.create_queue('qq_slow', backoff_base => '2 hours');
SELECT backoff_base, backoff_max FROM regress.queues WHERE queue = 'qq_slow';
SELECT pgjq.drop_queue('qq_slow');
-- explicit NULLs mean the defaults
SELECT pgjq.create_queue('qq_nulls', NULL, NULL, NULL, NULL, NULL);
SELECT * FROM regress.queues;

-- every range error, each 22023 invalid_parameter_value, nothing created
SELECT pgjq.create_queue('qq_bad', lease => '0');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', lease => '-1 second');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', lease => '8 days');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', lease => '7 days 00:00:00.000001');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', lease => '1 month');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', max_attempts => 0);
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', max_attempts => -1);
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', max_attempts => 10001);
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', backoff_base => '-1 second');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', backoff_base => '8 days', backoff_max => '8 days');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', backoff_max => '31 days');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', backoff_base => '10 seconds', backoff_max => '5 seconds');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', backoff_max => '0.5 seconds');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', retention => '-1 second');
\echo :SQLSTATE
SELECT pgjq.create_queue('qq_bad', retention => '3651 days');
\echo :SQLSTATE
SELECT count(*) AS bad_queues FROM pgjq.list_queues() WHERE queue = 'qq_bad';

-- a duplicate name: 42710 duplicate_object, the first queue is unchanged
SELECT pgjq.create_queue('qq_positional', lease => '1 second');
\echo :SQLSTATE
SELECT lease FROM regress.queues WHERE queue = 'qq_positional';
-- names are case sensitive
SELECT pgjq.create_queue('QQ_positional');
SELECT pgjq.drop_queue('QQ_positional');

-- alter_queue: NULL (or omitted) leaves a setting unchanged
SELECT pgjq.alter_queue('qq_default', lease => '1 minute');
SELECT * FROM regress.queues WHERE queue = 'qq_default';
SELECT pgjq.alter_queue('qq_default', max_attempts => 5, retention => '1 hour');
SELECT * FROM regress.queues WHERE queue = 'qq_default';
SELECT pgjq.alter_queue('qq_default');
SELECT pgjq.alter_queue('qq_default', NULL, NULL, NULL, NULL, NULL);
SELECT * FROM regress.queues WHERE queue = 'qq_default';
SELECT pgjq.alter_queue(queue => 'qq_default', backoff_base => '5 seconds', backoff_max => '1 minute');
SELECT * FROM regress.queues WHERE queue = 'qq_default';
-- the same ranges as create_queue; a rejected alter changes nothing
SELECT pgjq.alter_queue('qq_default', lease => '0');
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', lease => '8 days');
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', max_attempts => 0);
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', max_attempts => 10001);
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', retention => '-1 day');
\echo :SQLSTATE
-- backoff_max is checked against the stored backoff_base (5 s) and vice versa
SELECT pgjq.alter_queue('qq_default', backoff_max => '4 seconds');
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', backoff_base => '2 minutes');
\echo :SQLSTATE
SELECT pgjq.alter_queue('qq_default', lease => '2 minutes', backoff_base => '2 minutes');
\echo :SQLSTATE
SELECT * FROM regress.queues WHERE queue = 'qq_default';
-- both together may move past each other
SELECT pgjq.alter_queue('qq_default', backoff_base => '2 minutes', backoff_max => '2 minutes');
SELECT * FROM regress.queues WHERE queue = 'qq_default';

-- unknown queue: 42704 undefined_object for every queue function
SELECT pgjq.alter_queue('qq_nope', lease => '1 minute');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qq_nope');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qq_nope', force => true);
\echo :SQLSTATE
SELECT pgjq.pause('qq_nope');
\echo :SQLSTATE
SELECT pgjq.resume('qq_nope');
\echo :SQLSTATE
SELECT pgjq.purge('qq_nope');
\echo :SQLSTATE

-- pause and resume (idempotent), seen by list_queues and queue_stats
SELECT pgjq.pause('qq_default');
SELECT pgjq.pause('qq_default');
SELECT queue, paused FROM regress.queues ORDER BY queue;
SELECT queue, paused FROM pgjq.queue_stats WHERE queue = 'qq_default';
-- a paused queue still accepts jobs, but hands none out
SELECT pgjq.enqueue('qq_default') > 0 AS enqueued;
SELECT count(*) AS claimed_while_paused FROM pgjq.claim('qq_default');
SELECT pgjq.resume('qq_default');
SELECT pgjq.resume('qq_default');
SELECT queue, paused FROM pgjq.queue_stats WHERE queue = 'qq_default';
SELECT count(*) AS claimed_after_resume FROM pgjq.claim('qq_default');

-- purge removes ready and scheduled jobs only: running jobs and history stay
SELECT pgjq.create_queue('qq_purge');
SELECT count(*) FROM pgjq.enqueue_many('qq_purge', array_fill('{}'::jsonb, ARRAY[5]));
SELECT id AS done_id, token AS done_token FROM pgjq.claim('qq_purge') \gset
SELECT pgjq.complete(:done_id, :done_token);
SELECT id AS run_id, token AS run_token FROM pgjq.claim('qq_purge') \gset
SELECT count(*) FROM pgjq.enqueue_many('qq_purge', array_fill('{}'::jsonb, ARRAY[2]), delay => '1 hour');
SELECT ready, scheduled, running, completed FROM pgjq.queue_stats WHERE queue = 'qq_purge';
SELECT pgjq.purge('qq_purge');
SELECT ready, scheduled, running, completed FROM pgjq.queue_stats WHERE queue = 'qq_purge';
SELECT pgjq.purge('qq_purge');
-- the running job can still report its outcome
SELECT pgjq.complete(:run_id, :run_token);
SELECT ready, scheduled, running, completed FROM pgjq.queue_stats WHERE queue = 'qq_purge';

-- drop_queue refuses while jobs run (55006 object_in_use), changing nothing
SELECT pgjq.enqueue('qq_purge', '{"n": 1}') > 0 AS enqueued;
SELECT pgjq.enqueue('qq_purge', '{"n": 2}') > 0 AS enqueued;
SELECT id AS run_id, token AS run_token FROM pgjq.claim('qq_purge') \gset
SELECT pgjq.drop_queue('qq_purge');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qq_purge', false);
\echo :SQLSTATE
SELECT pgjq.drop_queue('qq_purge', NULL);
\echo :SQLSTATE
SELECT ready, running, completed FROM pgjq.queue_stats WHERE queue = 'qq_purge';
-- force drops it with all its unfinished jobs
SELECT pgjq.drop_queue('qq_purge', force => true);
SELECT count(*) AS queues FROM pgjq.list_queues() WHERE queue = 'qq_purge';
SELECT count(*) AS stats FROM pgjq.queue_stats WHERE queue = 'qq_purge';
SELECT count(*) AS job_rows FROM pgjq.job(:run_id);
-- the worker of the dropped queue learns its lease is gone
SELECT pgjq.complete(:run_id, :run_token);
SELECT pgjq.heartbeat(:run_id, :run_token) IS NULL AS heartbeat_is_null;
SELECT pgjq.enqueue('qq_purge');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim('qq_purge');
\echo :SQLSTATE
-- the name can be used again; the new queue starts empty with fresh settings
SELECT pgjq.create_queue('qq_purge', max_attempts => 2);
SELECT ready, scheduled, running, dead, completed, cancelled FROM pgjq.queue_stats WHERE queue = 'qq_purge';
SELECT max_attempts FROM regress.queues WHERE queue = 'qq_purge';

-- without running jobs drop_queue needs no force, and takes ready jobs along
SELECT pgjq.enqueue('qq_purge') > 0 AS enqueued;
SELECT pgjq.drop_queue('qq_purge');
SELECT count(*) AS queues FROM pgjq.list_queues() WHERE queue = 'qq_purge';

-- a dropped queue can be dropped only once
SELECT pgjq.drop_queue('qq_purge');
\echo :SQLSTATE

-- transactional: a rolled-back create or drop leaves nothing / the queue
BEGIN;
SELECT pgjq.create_queue('qq_rolled_back');
ROLLBACK;
BEGIN;
SELECT pgjq.drop_queue('qq_named');
ROLLBACK;
SELECT queue FROM regress.queues ORDER BY queue;

-- clean up
SELECT pgjq.drop_queue(queue, force => true) FROM regress.queues;
DROP VIEW regress.queues;
SELECT count(*) AS queues_left FROM pgjq.list_queues();
