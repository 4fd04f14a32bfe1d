-- bench/spike/scripts/chk_enqueue.sql (bench/spike/check): a producer.  One
-- job by enqueue or 2-5 by enqueue_many; what it enqueued goes to chk.enq in
-- the same transaction.  One transaction in five rolls back; one in five
-- also enqueues a job inside a savepoint that it rolls back (never in chk.enq).
\set rb random(1, 5)
\set k random(1, 5)
BEGIN;
\if :k = 1
INSERT INTO chk.enq SELECT pgjq.enqueue('q', p), p FROM (SELECT jsonb_build_object('c', :client_id::int, 'r', random()) AS p) s;
\else
INSERT INTO chk.enq SELECT e.id, a.p[e.ord::int] FROM (SELECT array_agg(jsonb_build_object('c', :client_id::int, 'i', g, 'r', random())) AS p FROM generate_series(1, :k::int) g) a, LATERAL pgjq.enqueue_many('q', a.p) WITH ORDINALITY AS e(id, ord);
\endif
\if :rb = 2
SAVEPOINT s;
SELECT pgjq.enqueue('q', '{"savepoint": "rolled back"}');
ROLLBACK TO SAVEPOINT s;
\endif
\if :rb = 1
ROLLBACK;
\else
COMMIT;
\endif
