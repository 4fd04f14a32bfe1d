--
-- security: privileges of the three roles, and the API's immunity to
-- objects a caller puts in front of pg_catalog in search_path.
--
\set VERBOSITY terse

CREATE ROLE regress_pgjq_none;
CREATE ROLE regress_pgjq_producer IN ROLE pgjq_producer;
CREATE ROLE regress_pgjq_worker IN ROLE pgjq_worker;
CREATE ROLE regress_pgjq_admin IN ROLE pgjq_admin;

---------------------------------------------------------------- search_path
-- Traps: functions and operators that shadow the pg_catalog ones for anyone
-- whose search_path puts schema evil first, and raise if ever called.  This
-- runs first in a fresh session, so every prepared statement of pgjq is
-- planned here, under the hostile search_path.
\i test/sql/include/traps.sql

SET ROLE regress_pgjq_admin;
SET search_path = evil, public, pg_catalog;
-- the traps work: the caller's own unqualified calls hit them
SELECT now();
SELECT 1::bigint = 1::bigint;
SELECT 'a'::text = 'a'::text;
SELECT jsonb_build_object('a', 1);
SELECT unnest(ARRAY[1]);
SELECT count(*) FROM pg_catalog.generate_series(1, 3);
SELECT clock_timestamp() + interval '1 second';
-- the API never does
SELECT pgjq.create_queue('qsec', backoff_base => '0', backoff_max => '0', max_attempts => 2);
SELECT pgjq.alter_queue('qsec', lease => '1 minute');
SELECT pgjq.enqueue('qsec', '{"a": 1}', fair_key => 'k1', dedup_key => 'd1') AS s1 \gset
SELECT pgjq.enqueue('qsec', '{"a": 1}', fair_key => 'k1', dedup_key => 'd1') = :s1 AS dedup_same_id;
SELECT pgjq.enqueue('qsec', delay => '1 hour') > 0 AS enqueued;
SELECT pgjq.enqueue('qsec', run_at => '2000-01-01 00:00:00+00') > 0 AS enqueued;
SELECT pg_catalog.count(*) AS enqueued
  FROM pgjq.enqueue_many('qsec', ARRAY['{"b": 1}', '{"b": 2}', '{"b": 3}']::jsonb[],
                         fair_keys => ARRAY['k2', 'k3', NULL], dedup_keys => ARRAY['d1', 'd2', NULL]);
SELECT pg_catalog.count(*) AS claimed, pg_catalog.count(DISTINCT token) AS tokens
  FROM pgjq.claim('qsec', 2, worker => 'w');
-- heartbeat and complete
SELECT id AS s_id, token AS s_token FROM pgjq.claim('qsec') \gset
SELECT pgjq.heartbeat(:s_id, :s_token) IS NOT NULL AS heartbeat_ok;
SELECT pgjq.heartbeat(:s_id, :s_token, '1 minute') IS NOT NULL AS heartbeat_ok;
SELECT pgjq.complete(:s_id, :s_token);
-- fail, promote, snooze
SELECT id AS s_id, token AS s_token FROM pgjq.claim('qsec') \gset
SELECT pgjq.fail(:s_id, :s_token, 'failed', retry_in => '0');
SELECT pgjq.promote() AS promoted;
SELECT id AS s_id, token AS s_token FROM pgjq.claim('qsec') \gset
SELECT pgjq.snooze(:s_id, :s_token, '0');
SELECT pgjq.promote() AS promoted;
-- cancel of a running job, and rescue
SELECT id AS s_id, token AS s_token FROM pgjq.claim('qsec', 1, lease => '10 milliseconds') \gset
SELECT pgjq.cancel(:s_id);
SELECT pg_catalog.pg_sleep(0.05);
SELECT pgjq.rescue() AS rescued;
SELECT state FROM pgjq.job(:s_id);
SELECT pgjq.complete(ARRAY[:s_id], ARRAY[:s_token]) AS completed;
-- dead and retry_dead
SELECT pgjq.create_queue('qsec_dead', max_attempts => 1);
SELECT pgjq.enqueue('qsec_dead') AS s_dead \gset
SELECT token AS s_dead_token FROM pgjq.claim('qsec_dead') \gset
SELECT pgjq.fail(:s_dead, :s_dead_token, 'fatal');
SELECT pgjq.retry_dead('qsec_dead') AS redriven;
SELECT token AS s_dead_token FROM pgjq.claim('qsec_dead') \gset
SELECT pgjq.fail(:s_dead, :s_dead_token, 'fatal again');
SELECT pgjq.retry_dead('qsec_dead', ARRAY[:s_dead]) AS redriven_by_id;
-- waiting and multi-queue claims, await, limits
CALL pgjq.await(ARRAY['qsec', 'qsec_dead'], '10 milliseconds');
SELECT id OPERATOR(pg_catalog.=) :s_dead AS is_s_dead, token AS s_dead_token
  FROM pgjq.claim(ARRAY['qsec', 'qsec_dead'], 1, wait => '10 milliseconds') \gset
SELECT :'is_s_dead' AS is_s_dead;
SELECT pgjq.complete(:s_dead, :s_dead_token);
SELECT pg_catalog.count(*) AS claimed FROM pgjq.claim(ARRAY['qsec', 'qsec_dead'], 1, wait => '10 milliseconds');
SELECT pgjq.alter_queue('qsec_dead', concurrency => 1, key_concurrency => 1, rate => 100);
SELECT pgjq.enqueue('qsec_dead', fair_key => 'k') AS s_lim \gset
SELECT token AS s_lim_token FROM pgjq.claim('qsec_dead', 5) \gset
SELECT pgjq.complete(:s_lim, :s_lim_token);
-- queue administration and maintenance
SELECT pgjq.pause('qsec');
SELECT pgjq.resume('qsec');
SELECT promoted, rescued, pruned FROM pgjq.maintain();
SELECT pgjq.prune() AS pruned;
-- observability
SELECT state FROM pgjq.job(:s_dead);
SELECT ready, scheduled, running, dead, completed, cancelled,
       oldest_ready_age IS NOT NULL AS has_age, next_run_at IS NOT NULL AS has_next_run
  FROM pgjq.queue_stats WHERE queue OPERATOR(pg_catalog.=) 'qsec';
SELECT queue, lease, max_attempts FROM pgjq.list_queues() WHERE queue OPERATOR(pg_catalog.=) 'qsec';
SELECT pgjq.purge('qsec') AS purged;
SELECT pgjq.drop_queue('qsec_dead');
RESET search_path;
RESET ROLE;
-- the same as the superuser who owns the extension
SET search_path = evil, public, pg_catalog;
SELECT pgjq.enqueue('qsec') AS s2 \gset
SELECT id OPERATOR(pg_catalog.=) :s2 AS claimed_it, token AS s2_token FROM pgjq.claim('qsec') \gset
SELECT :'claimed_it' AS claimed_it;
SELECT pgjq.complete(:s2, :s2_token);
SELECT state FROM pgjq.job(:s2);
RESET search_path;
DROP FUNCTION public.now();
SET client_min_messages = warning;
DROP SCHEMA evil CASCADE;
RESET client_min_messages;

---------------------------------------------------------------- privileges
SELECT pgjq.purge('qsec') AS purged;
SELECT pgjq.enqueue('qsec') AS p1 \gset

-- a role with none of the pgjq roles can call nothing: 42501
SET ROLE regress_pgjq_none;
SELECT pgjq.enqueue('qsec');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim('qsec');
\echo :SQLSTATE
SELECT pgjq.complete(:p1, 1);
\echo :SQLSTATE
SELECT pgjq.cancel(:p1);
\echo :SQLSTATE
SELECT pgjq.create_queue('qsec_none');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.job(:p1);
\echo :SQLSTATE
SELECT count(*) FROM pgjq.queue_stats;
\echo :SQLSTATE
SELECT count(*) FROM pgjq.list_queues();
\echo :SQLSTATE
SELECT pgjq.maintain();
\echo :SQLSTATE
RESET ROLE;

-- a producer enqueues, cancels and looks, but cannot claim or administer
SET ROLE regress_pgjq_producer;
SELECT pgjq.enqueue('qsec', '{"from": "producer"}') AS p2 \gset
SELECT count(*) AS enqueued FROM pgjq.enqueue_many('qsec', ARRAY['{}', '{}']::jsonb[]);
SELECT state, payload FROM pgjq.job(:p2);
SELECT ready FROM pgjq.queue_stats WHERE queue = 'qsec';
SELECT pgjq.cancel(:p2);
SELECT count(*) FROM pgjq.claim('qsec');
\echo :SQLSTATE
SELECT count(*) FROM pgjq.claim(ARRAY['qsec']);
\echo :SQLSTATE
CALL pgjq.await(ARRAY['qsec'], '0');
\echo :SQLSTATE
SELECT pgjq.complete(:p1, 1);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:p1], ARRAY[1]::bigint[]);
\echo :SQLSTATE
SELECT pgjq.fail(:p1, 1);
\echo :SQLSTATE
SELECT pgjq.heartbeat(:p1, 1);
\echo :SQLSTATE
SELECT pgjq.snooze(:p1, 1, '1 second');
\echo :SQLSTATE
SELECT pgjq.create_queue('qsec_producer');
\echo :SQLSTATE
SELECT pgjq.alter_queue('qsec', lease => '1 second');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qsec', force => true);
\echo :SQLSTATE
SELECT pgjq.pause('qsec');
\echo :SQLSTATE
SELECT pgjq.purge('qsec');
\echo :SQLSTATE
SELECT pgjq.retry_dead('qsec');
\echo :SQLSTATE
SELECT pgjq.promote();
\echo :SQLSTATE
SELECT count(*) FROM pgjq.list_queues();
\echo :SQLSTATE
-- the tables stay private
SELECT count(*) FROM pgjq.job;
\echo :SQLSTATE
SELECT count(*) FROM pgjq.queue;
\echo :SQLSTATE
UPDATE pgjq.queue SET paused = true;
\echo :SQLSTATE
RESET ROLE;

-- a worker claims and reports outcomes, but cannot enqueue or administer
SET ROLE regress_pgjq_worker;
CALL pgjq.await(ARRAY['qsec'], '0');
SELECT id AS w1, token AS w1_token FROM pgjq.claim(ARRAY['qsec']) \gset
SELECT pgjq.heartbeat(:w1, :w1_token) IS NOT NULL AS heartbeat_ok;
SELECT pgjq.complete(:w1, :w1_token);
CREATE TEMP TABLE w AS SELECT * FROM pgjq.claim('qsec', 2);
SELECT pgjq.complete(array_agg(id ORDER BY id), array_agg(token ORDER BY id)) AS completed
  FROM (SELECT * FROM w ORDER BY id LIMIT 1) s;
SELECT id AS w2, token AS w2_token FROM w ORDER BY id DESC LIMIT 1 \gset
SELECT pgjq.snooze(:w2, :w2_token, '0');
SELECT state FROM pgjq.job(:w2);
SELECT running FROM pgjq.queue_stats WHERE queue = 'qsec';
SELECT pgjq.enqueue('qsec');
\echo :SQLSTATE
SELECT pgjq.enqueue_many('qsec', ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT pgjq.cancel(:w2);
\echo :SQLSTATE
SELECT pgjq.create_queue('qsec_worker');
\echo :SQLSTATE
SELECT pgjq.drop_queue('qsec');
\echo :SQLSTATE
SELECT pgjq.retry_dead('qsec');
\echo :SQLSTATE
SELECT pgjq.maintain();
\echo :SQLSTATE
SELECT pgjq.rescue();
\echo :SQLSTATE
SELECT count(*) FROM pgjq.job;
\echo :SQLSTATE
DROP TABLE w;
RESET ROLE;

-- an admin can do everything through the API, but not touch the tables
SET ROLE regress_pgjq_admin;
SELECT pgjq.create_queue('qsec_admin');
SELECT pgjq.alter_queue('qsec_admin', max_attempts => 1);
SELECT pgjq.enqueue('qsec_admin') AS a1 \gset
SELECT token AS a1_token FROM pgjq.claim('qsec_admin') \gset
SELECT pgjq.fail(:a1, :a1_token, 'dead on arrival');
SELECT pgjq.retry_dead('qsec_admin');
SELECT pgjq.pause('qsec_admin');
SELECT pgjq.resume('qsec_admin');
SELECT pgjq.purge('qsec_admin');
SELECT pgjq.promote() AS promoted, pgjq.rescue() AS rescued, pgjq.prune() AS pruned;
SELECT queue FROM pgjq.list_queues() WHERE queue LIKE 'qsec%' ORDER BY queue;
SELECT pgjq.drop_queue('qsec_admin');
SELECT pgjq.drop_queue('qsec', force => true);
SELECT count(*) FROM pgjq.job;
\echo :SQLSTATE
DELETE FROM pgjq.queue;
\echo :SQLSTATE
SELECT nextval('pgjq.token_seq');
\echo :SQLSTATE
RESET ROLE;

---------------------------------------------------------------- a fresh database
-- The limit counters of a database are rebuilt from its jobs by the first
-- call that needs them: here under the hostile search_path, as a non-superuser.
SELECT current_database() AS regress_db \gset
SET client_min_messages = warning;
CREATE DATABASE regress_pgjq_fresh;
RESET client_min_messages;
\c regress_pgjq_fresh
\set VERBOSITY terse
CREATE EXTENSION pgjq;
\i test/sql/include/traps.sql
SET ROLE regress_pgjq_admin;
SET search_path = evil, public, pg_catalog;
SELECT pgjq.create_queue('qfresh', concurrency => 1, key_concurrency => 1, rate => 1000);
SELECT pg_catalog.count(*) AS enqueued
  FROM pgjq.enqueue_many('qfresh', ARRAY['{}', '{}']::jsonb[], fair_keys => ARRAY['a', 'b']);
SELECT id AS f_id, token AS f_token FROM pgjq.claim('qfresh', 10) \gset
SELECT pg_catalog.count(*) AS claimed_at_limit FROM pgjq.claim('qfresh', 10);
SELECT pgjq.complete(:f_id, :f_token);
SELECT pg_catalog.count(*) AS claimed FROM pgjq.claim(ARRAY['qfresh'], 10, wait => '10 milliseconds');
CALL pgjq.await(ARRAY['qfresh'], '10 milliseconds');
SELECT running, ready, completed FROM pgjq.queue_stats;
RESET search_path;
RESET ROLE;
\c :regress_db
DROP DATABASE regress_pgjq_fresh;

DROP ROLE regress_pgjq_none, regress_pgjq_producer, regress_pgjq_worker, regress_pgjq_admin;
