--
-- schedule: periodic jobs.  Cron expressions (5 fields, aliases, @every)
-- and their errors, each naming the field; slots in a time zone across a
-- spring-forward and a fall-back day; schedule/unschedule/list_schedules;
-- firing: one job per slot, carrying its slot, and catch_up after missed
-- slots.  Two firers at once: test/specs/schedule_fire.spec; the worker and
-- a crash: test/t/027_schedule_worker.pl.
--
\set VERBOSITY terse
SET timezone = 'UTC';

-- slots of plain expressions
SELECT * FROM pgjq._cron_slots('*/15 * * * *', 'UTC', '2026-01-01 00:07+00', 3);
SELECT * FROM pgjq._cron_slots('0 9-17/4 * * mon-fri', 'UTC', '2026-01-02 10:00+00', 4);
SELECT * FROM pgjq._cron_slots('30 6 1,15 * *', 'UTC', '2026-01-10 00:00+00', 3);
-- both day fields restricted: either matches (the 13th, a Monday, or a Friday)
SELECT * FROM pgjq._cron_slots('0 0 13 * 5', 'UTC', '2026-04-01 00:00+00', 4);
SELECT * FROM pgjq._cron_slots('0 12 * jan,JUL sun', 'UTC', '2026-06-25 00:00+00', 2);
SELECT * FROM pgjq._cron_slots('0 0 * * 7', 'UTC', '2026-01-01 00:00+00', 1);
SELECT * FROM pgjq._cron_slots('@hourly', 'UTC', '2026-01-01 00:00+00', 2);
SELECT * FROM pgjq._cron_slots('@daily', 'Europe/Berlin', '2026-01-01 00:00+00', 2);
SELECT * FROM pgjq._cron_slots('@every 10 seconds', 'UTC', '2026-01-01 00:00:05+00', 2);
SELECT * FROM pgjq._cron_slots('@every 90 minutes', 'UTC', '2026-01-01 00:00+00', 2);
-- February 30th never comes
SELECT count(*) FROM pgjq._cron_slots('0 0 30 2 *', 'UTC', '2026-01-01 00:00+00', 1);

-- daylight saving, America/New_York (2026: spring forward Mar 8 02:00, fall back Nov 1 02:00)
SET timezone = 'America/New_York';
-- 02:30 does not exist on March 8th: no slot that day
SELECT * FROM pgjq._cron_slots('30 2 * * *', 'America/New_York', '2026-03-06 12:00-05', 3);
-- 01:30 occurs twice on November 1st: one slot
SELECT * FROM pgjq._cron_slots('30 1 * * *', 'America/New_York', '2026-10-31 12:00-04', 2);
-- every half hour through the fall-back: the repeated 01:00 and 01:30 fire once
SELECT * FROM pgjq._cron_slots('*/30 * * * *', 'America/New_York', '2026-11-01 00:00-04', 5);
-- and through the spring-forward: 02:00 and 02:30 do not exist
SELECT * FROM pgjq._cron_slots('*/30 * * * *', 'America/New_York', '2026-03-08 00:45-05', 3);
-- @every is absolute time: no gap, no repeat
SELECT * FROM pgjq._cron_slots('@every 1 hour', 'America/New_York', '2026-11-01 00:30-04', 3);
SET timezone = 'UTC';

-- bad expressions: each error names the field (in its detail)
\set VERBOSITY default
SELECT pgjq._cron_slots('* * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('60 * * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* 24 * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* * 0 * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* * * 13 *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* * * * 8', 'UTC', now(), 1);
SELECT pgjq._cron_slots('*/0 * * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('5-1 * * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('x * * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('1,,2 * * * *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* * * foo *', 'UTC', now(), 1);
SELECT pgjq._cron_slots('@sometimes', 'UTC', now(), 1);
SELECT pgjq._cron_slots('@every 0 seconds', 'UTC', now(), 1);
SELECT pgjq._cron_slots('@every 10 fortnights', 'UTC', now(), 1);
SELECT pgjq._cron_slots('* * * * *', 'Mars/Olympus_Mons', now(), 1);
\set VERBOSITY terse

-- schedule, list, replace, unschedule
SELECT pgjq.create_queue('qs');
SELECT pgjq.schedule('nightly', '0 3 * * *', 'qs', '{"task": "report"}', time_zone => 'Europe/Berlin') > now() AS first_slot_ahead;
SELECT name, cron, queue, payload, time_zone, catch_up, last_slot FROM pgjq.list_schedules();
SELECT pgjq.schedule('nightly', '0 4 * * *', 'qs', '{"task": "report2"}', catch_up => 'all') IS NOT NULL AS replaced;
SELECT name, cron, payload, time_zone, catch_up FROM pgjq.list_schedules();
SELECT pgjq.unschedule('nightly'), pgjq.unschedule('nightly');

-- bad arguments, named
SELECT pgjq.schedule('s', '* * * * *', 'no_such_queue');
SELECT pgjq.schedule('s', '* * * * *', 'qs', '[1, 2]');
SELECT pgjq.schedule('s', '* * * * *', 'qs', catch_up => 'some');
SELECT pgjq.schedule('s', '* * * * *', 'qs', time_zone => 'Nowhere/Else');
SELECT pgjq.schedule('s', '0 0 31 4 *', 'qs');
SELECT pgjq.schedule('', '* * * * *', 'qs');
SELECT pgjq.schedule(NULL, '* * * * *', 'qs');
SELECT pgjq.schedule('s', NULL, 'qs');
SELECT count(*) FROM pgjq.list_schedules();

-- firing: each due slot once, its time in the payload; catch_up after downtime
SELECT pgjq.schedule('all', '* * * * *', 'qs', '{"k": "all"}', catch_up => 'all') IS NOT NULL AS ok;
SELECT pgjq.schedule('one', '* * * * *', 'qs', '{"k": "one"}', catch_up => 'one') IS NOT NULL AS ok;
SELECT pgjq.schedule('none', '* * * * *', 'qs', '{"k": "none"}', catch_up => 'none') IS NOT NULL AS ok;
BEGIN;
-- as if the worker had been down for five minutes
UPDATE pgjq.schedules SET next_slot = date_trunc('minute', now()) - interval '5 minutes';
SELECT pgjq._fire_schedules();
SELECT payload->>'k' AS schedule, count(*) AS jobs,
       min((payload->>'pgjq_slot')::timestamptz) = date_trunc('minute', now()) - interval '5 minutes' AS from_first,
       max((payload->>'pgjq_slot')::timestamptz) = date_trunc('minute', now()) AS to_latest
  FROM pgjq.claim('qs', 100) GROUP BY 1 ORDER BY 1;
SELECT name, next_slot = date_trunc('minute', now()) + interval '1 minute' AS next_ahead,
       last_slot = date_trunc('minute', now()) AS last_fired
  FROM pgjq.list_schedules() ORDER BY name;
-- nothing is due any more: firing again enqueues nothing
SELECT pgjq._fire_schedules();
COMMIT;

-- a schedule whose queue was dropped skips its slots (a warning), and goes on
SELECT pgjq.create_queue('qs_gone');
SELECT pgjq.schedule('orphan', '* * * * *', 'qs_gone') IS NOT NULL AS ok;
SELECT pgjq.drop_queue('qs_gone');
BEGIN;
UPDATE pgjq.schedules SET next_slot = date_trunc('minute', now()) WHERE name = 'orphan';
SELECT pgjq._fire_schedules();
SELECT next_slot > now() AS moved_on FROM pgjq.list_schedules() WHERE name = 'orphan';
COMMIT;

-- only pgjq_admin may schedule
SELECT has_function_privilege('pgjq_producer', 'pgjq.schedule(text, text, text, jsonb, text, text)', 'EXECUTE') AS producer,
       has_function_privilege('pgjq_admin', 'pgjq.schedule(text, text, text, jsonb, text, text)', 'EXECUTE') AS admin;

SELECT pgjq.unschedule(name) FROM pgjq.list_schedules();
SELECT pgjq.drop_queue('qs', force => true);
