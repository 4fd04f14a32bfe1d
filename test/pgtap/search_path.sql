-- search_path attacks.  A caller who puts a schema of their own first in
-- search_path, ahead of pg_catalog, with look-alike functions and operators
-- (now(), jsonb_build_object(), nextval(), "=" on bigint, text, integer and
-- "char", timestamp comparisons and arithmetic, ...) and temporary tables
-- named like pgjq's must not change what enqueue, claim and the outcomes do:
-- every pgjq function pins its own search_path and qualifies what it uses.
-- Each evil function records that it was called; the test asserts that none
-- was, and that the calls gave the right results.
--
-- While the evil path is in force only plain INSERT ... SELECT statements run
-- (no operators, no pgTAP: pgTAP itself would call the evil operators);
-- the assertions come after RESET search_path.

\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off

BEGIN;
SELECT plan(27);

CREATE SCHEMA evil;
CREATE TABLE evil.called (what text);

-- Functions: each logs its name and returns something plausible but wrong.
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('now()'); RETURN '2000-01-01'; END$$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('clock_timestamp()'); RETURN '2000-01-01'; END$$;
CREATE FUNCTION evil.statement_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('statement_timestamp()'); RETURN '2000-01-01'; END$$;
CREATE FUNCTION evil.transaction_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('transaction_timestamp()'); RETURN '2000-01-01'; END$$;
CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('nextval()'); RETURN 1; END$$;
CREATE FUNCTION evil.jsonb_build_object(VARIADIC text[]) RETURNS jsonb LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('jsonb_build_object(text[])'); RETURN '{"evil":true}'; END$$;
CREATE FUNCTION evil.jsonb_build_object() RETURNS jsonb LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('jsonb_build_object()'); RETURN '{"evil":true}'; END$$;
CREATE FUNCTION evil.count(anyelement) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('count(anyelement)'); RETURN 0; END$$;
CREATE FUNCTION evil.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('pg_advisory_xact_lock()'); END$$;
CREATE FUNCTION evil.lower(text) RETURNS text LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('lower()'); RETURN $1; END$$;
CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('length()'); RETURN 0; END$$;
CREATE FUNCTION evil.octet_length(text) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('octet_length()'); RETURN 0; END$$;
CREATE FUNCTION evil.random() RETURNS double precision LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('random()'); RETURN 0; END$$;

-- Operators: equality always true, orderings inverted, arithmetic wrong.
CREATE FUNCTION evil.eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('bigint = bigint'); RETURN true; END$$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.eq);
CREATE FUNCTION evil.eq(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('integer = integer'); RETURN true; END$$;
CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.eq);
CREATE FUNCTION evil.eq(bigint, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('bigint = integer'); RETURN true; END$$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.eq);
CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('text = text'); RETURN true; END$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq);
CREATE FUNCTION evil.eq("char", "char") RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('"char" = "char"'); RETURN true; END$$;
CREATE OPERATOR evil.= (LEFTARG = "char", RIGHTARG = "char", FUNCTION = evil.eq);
CREATE FUNCTION evil.ne(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('bigint <> bigint'); RETURN false; END$$;
CREATE OPERATOR evil.<> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.ne);
CREATE FUNCTION evil.lt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('timestamptz < timestamptz'); RETURN $1 > $2; END$$;
CREATE OPERATOR evil.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.lt);
CREATE FUNCTION evil.le(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('timestamptz <= timestamptz'); RETURN $1 > $2; END$$;
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.le);
CREATE FUNCTION evil.gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('timestamptz > timestamptz'); RETURN $1 < $2; END$$;
CREATE OPERATOR evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.gt);
CREATE FUNCTION evil.plus(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('timestamptz + interval'); RETURN '2000-01-01'; END$$;
CREATE OPERATOR evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.plus);
CREATE FUNCTION evil.minus(timestamptz, timestamptz) RETURNS interval LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('timestamptz - timestamptz'); RETURN '0'; END$$;
CREATE OPERATOR evil.- (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.minus);
CREATE FUNCTION evil.plus(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('bigint + bigint'); RETURN 0; END$$;
CREATE OPERATOR evil.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.plus);
CREATE FUNCTION evil.plus(integer, integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('integer + integer'); RETURN 0; END$$;
CREATE OPERATOR evil.+ (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.plus);
CREATE FUNCTION evil.jsonb_get(jsonb, text) RETURNS jsonb LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.called VALUES ('jsonb -> text'); RETURN 'null'; END$$;
CREATE OPERATOR evil.-> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = evil.jsonb_get);

-- Temporary tables named like pgjq's, to catch an unqualified relation name.
CREATE TEMP TABLE queue (LIKE pgjq.queue);
CREATE TEMP TABLE job (LIKE pgjq.job);
CREATE TEMP TABLE job_history (LIKE pgjq.job_history);

-- Results of the calls made under the evil path.
CREATE TEMP TABLE got (step text, val text);
CREATE TEMP TABLE delayed (id bigint);
CREATE TEMP TABLE leases (id bigint, token bigint, attempt integer, payload jsonb, lease_until timestamptz);

SET LOCAL search_path = evil, pg_temp, pg_catalog, public;

INSERT INTO got SELECT 'create_queue', pgjq.create_queue('evilq', lease => '1 hour', max_attempts => 3);
INSERT INTO got SELECT 'create_queue2', pgjq.create_queue('evilq2');
INSERT INTO got SELECT 'enqueue1', pgjq.enqueue('evilq', '{"n":1}', priority => 1);
INSERT INTO got SELECT 'enqueue2', pgjq.enqueue('evilq', '{"n":2}', fair_key => 'k', dedup_key => 'd2');
INSERT INTO got SELECT 'enqueue2_dup', pgjq.enqueue('evilq', '{"n":22}', fair_key => 'k', dedup_key => 'd2');
INSERT INTO delayed SELECT pgjq.enqueue('evilq', '{"n":3}', delay => '1 hour');
INSERT INTO got SELECT 'enqueue_delayed', id FROM delayed;
INSERT INTO got SELECT 'enqueue_many', i FROM pgjq.enqueue_many('evilq', ARRAY['{"n":4}', '{"n":5}']::jsonb[]) i;
INSERT INTO got SELECT 'promote', pgjq.promote();
INSERT INTO got SELECT 'rescue', pgjq.rescue();
INSERT INTO leases SELECT id, token, attempt, payload, lease_until FROM pgjq.claim('evilq', 3, worker => 'w');
INSERT INTO leases SELECT id, token, attempt, payload, lease_until FROM pgjq.claim(ARRAY['evilq2', 'evilq'], 10, worker => 'w');
-- The first lease (ORDER BY uses the type's default btree class, not "<").
INSERT INTO got SELECT 'job_running', j.state FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l, pgjq.job(l.id) j;
INSERT INTO got SELECT 'job_delayed', j.state FROM delayed d, pgjq.job(d.id) j;
INSERT INTO got SELECT 'heartbeat', pgjq.heartbeat(id, token, '2 hours') FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l;
INSERT INTO got SELECT 'complete', pgjq.complete(id, token) FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l;
INSERT INTO got SELECT 'complete_again', pgjq.complete(id, token) FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l;
INSERT INTO got SELECT 'fail', pgjq.fail(id, token, 'boom') FROM (SELECT * FROM leases ORDER BY payload LIMIT 1 OFFSET 1) l;
INSERT INTO got SELECT 'snooze', pgjq.snooze(id, token, '1 hour') FROM (SELECT * FROM leases ORDER BY payload LIMIT 1 OFFSET 2) l;
INSERT INTO got SELECT 'complete_many', pgjq.complete(ARRAY(SELECT id FROM leases ORDER BY payload OFFSET 3),
													   ARRAY(SELECT token FROM leases ORDER BY payload OFFSET 3));
INSERT INTO got SELECT 'stale_fail', pgjq.fail(id, token) FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l;
INSERT INTO got SELECT 'cancel', pgjq.cancel(id) FROM (SELECT * FROM leases ORDER BY payload LIMIT 1 OFFSET 1) l;
INSERT INTO got SELECT 'job_state', j.state FROM (SELECT * FROM leases ORDER BY payload LIMIT 1) l, pgjq.job(l.id) j;
INSERT INTO got SELECT 'job_states', j.state FROM leases l, pgjq.job(l.id) j;
INSERT INTO got SELECT 'stats', s::text FROM pgjq.queue_stats s;
INSERT INTO got SELECT 'list_queues', q.max_attempts FROM pgjq.list_queues() q ORDER BY q.queue LIMIT 1;
INSERT INTO got SELECT 'maintain', m::text FROM pgjq.maintain() m;
INSERT INTO got SELECT 'purge', pgjq.purge('evilq');

RESET search_path;

SELECT is_empty($$SELECT what FROM evil.called$$,
	'no look-alike function or operator from the caller''s search_path was called');
SELECT is((SELECT count(*) FROM pg_temp.queue) + (SELECT count(*) FROM pg_temp.job)
		  + (SELECT count(*) FROM pg_temp.job_history), 0::bigint,
	'the temporary look-alike tables were not touched');

SELECT is((SELECT count(*) FROM got WHERE step LIKE 'enqueue%'), 6::bigint, 'every enqueue returned');
SELECT is((SELECT count(DISTINCT val) FROM got WHERE step LIKE 'enqueue%'), 5::bigint,
	'five distinct ids: the duplicate dedup_key returned the first one''s id');
SELECT is((SELECT val FROM got WHERE step = 'enqueue2_dup'), (SELECT val FROM got WHERE step = 'enqueue2'),
	'the duplicate got the existing job''s id');
SELECT is((SELECT count(*) FROM leases), 4::bigint, 'claim handed out the four ready jobs (not the delayed one)');
SELECT is((SELECT count(DISTINCT token) FROM leases), 2::bigint, 'two claim calls, two tokens');
SELECT ok((SELECT bool_and(lease_until > now() + '50 minutes' AND lease_until < now() + '70 minutes') FROM leases),
	'leases end about an hour from now (the queue''s lease), by the real clock');
SELECT ok((SELECT bool_and(attempt = 1) FROM leases), 'first attempt everywhere');
SELECT is((SELECT array_agg(payload->>'n' ORDER BY payload) FROM leases), ARRAY['1', '2', '4', '5'],
	'the claimed payloads are the enqueued ones, unchanged');
SELECT ok((SELECT val::timestamptz > now() + '110 minutes' FROM got WHERE step = 'heartbeat'),
	'heartbeat extended the lease by two hours, by the real clock');
SELECT is((SELECT val FROM got WHERE step = 'complete'), 'true', 'complete succeeded');
SELECT is((SELECT val FROM got WHERE step = 'complete_again'), 'false', 'a second complete is stale');
SELECT is((SELECT val FROM got WHERE step = 'fail'), 'retry', 'fail with attempts left is a retry');
SELECT is((SELECT val FROM got WHERE step = 'snooze'), 'true', 'snooze succeeded');
SELECT is((SELECT val FROM got WHERE step = 'complete_many'), '1', 'complete(ids, tokens) completed the last lease');
SELECT is((SELECT val FROM got WHERE step = 'stale_fail'), 'stale', 'fail of a completed job is stale');
SELECT is((SELECT val FROM got WHERE step = 'cancel'), 'true', 'cancel of a retrying job worked');
SELECT is((SELECT val FROM got WHERE step = 'job_state'), 'completed', 'job() reports the completed job');
SELECT is((SELECT val FROM got WHERE step = 'job_running'), 'running', 'job() reports a running job');
SELECT is((SELECT val FROM got WHERE step = 'job_delayed'), 'scheduled', 'job() reports a delayed job');
SELECT is((SELECT array_agg(val ORDER BY val) FROM got WHERE step = 'job_states'),
	ARRAY['cancelled', 'completed', 'completed', 'scheduled'],
	'job() reports the completed, cancelled and snoozed jobs');
SELECT is((SELECT val FROM got WHERE step = 'list_queues'), '3', 'list_queues() shows the queue''s settings');
SELECT is((SELECT val FROM got WHERE step = 'promote'), '0', 'promote found nothing due (the delayed job is an hour away)');
SELECT is((SELECT val FROM got WHERE step = 'rescue'), '0', 'rescue found nothing expired');
SELECT is((SELECT val FROM got WHERE step = 'purge'), '2',
	'purge removed the delayed and the snoozed job');
SELECT results_eq(
	$$SELECT ready, scheduled, running, completed, cancelled FROM pgjq.queue_stats WHERE queue = 'evilq'$$,
	$$VALUES (0::bigint, 0::bigint, 0::bigint, 2::bigint, 1::bigint)$$,
	'queue_stats agrees: two completed, one cancelled, nothing left');

SELECT * FROM finish();
ROLLBACK;
