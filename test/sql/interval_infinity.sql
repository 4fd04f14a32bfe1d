--
-- interval_infinity: an infinite interval (PostgreSQL 17 added 'infinity'
-- and '-infinity' to the interval type) is refused by every pgjq argument
-- that takes an interval, with the argument's name (22023) and nothing
-- changed.  On PostgreSQL 15 the cast itself fails first (22007), before
-- pgjq is called: interval_infinity_1.out is that version's output.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qi');
SELECT pgjq.enqueue('qi', '{}') AS id \gset
SELECT id = :id AS claimed, token FROM pgjq.claim('qi') \gset
SELECT :'claimed' AS claimed;

SELECT pgjq.enqueue('qi', delay => 'infinity');
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.enqueue('qi', delay => '-infinity');
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.create_queue('qi2', lease => 'infinity');
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.alter_queue('qi', retention => 'infinity');
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.snooze(:id, :token, 'infinity');
SELECT :'SQLSTATE' AS sqlstate;
SELECT pgjq.fail(:id, :token, 'x', retry_in => '-infinity');
SELECT :'SQLSTATE' AS sqlstate;

-- nothing changed: the running job still runs, no queue qi2, settings kept
SELECT state FROM pgjq.job(:id);
SELECT count(*) AS qi2 FROM pgjq.list_queues() WHERE queue = 'qi2';
SELECT retention FROM pgjq.list_queues() WHERE queue = 'qi';
SELECT pgjq.complete(:id, :token);
SELECT pgjq.drop_queue('qi');
