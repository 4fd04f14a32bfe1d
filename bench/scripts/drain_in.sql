-- bench/scripts/drain_in.sql: drain.sql for a client of a Citus
-- coordinator (bench/citus): claim in one transaction, report the batch in a
-- second with the queue-first complete_in(queue, ids, tokens), so that
-- Citus delegates both calls to the worker that owns the queue (a plain
-- complete(ids, tokens) would run on the coordinator and be refused with
-- SQLSTATE PJ001).  An empty claim sleeps :poll ms (bench/citus prefills
-- the queue so that none is empty, and checks).
-- Variables: queue, batch, poll (ms).
-- prepared per client: 2
SELECT count(*) AS n,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks
  FROM pgjq.claim(:queue, :batch) \gset
\if :n = 0
  \sleep :poll ms
\else
SELECT pgjq.complete_in(:queue, :ids::bigint[], :toks::bigint[]);
\endif
