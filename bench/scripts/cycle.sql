-- bench/scripts/cycle.sql: a worker that runs one transaction per cycle
-- (D3): complete_and_claim completes the batch the client holds (in
-- variables ids and toks, '{}' at the start) and claims the next.
--
-- With stop=1 a cycle that claims nothing stops the client (see drain.sql):
-- it has just completed its last batch, and every other job is completed or
-- held by a client that will complete it.  With stop=0 it sleeps :poll ms.
-- Variables: queue, batch, stop (0/1), poll (ms), ids and toks ('{}').
-- prepared per client: 1
SELECT count(*) AS n,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks
  FROM pgjq.complete_and_claim(:queue, :ids::bigint[], :toks::bigint[], :batch) \gset
\if :n = 0
  \if :stop
    \sleep 1000 ms
    \set stop_now 1 / 0
  \endif
  \sleep :poll ms
\endif
