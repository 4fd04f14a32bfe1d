-- bench/scripts/drain.sql: a worker that claims in one transaction and
-- completes in a second (D1, D2, H1).  Batch 1 reports with
-- complete(id, token), larger batches with complete(ids[], tokens[]).
--
-- When a claim comes back empty: with stop=1 (D1, a drain of pre-seeded jobs
-- with no producer) the client stops, by a \set that fails (a division by
-- zero), which aborts this pgbench client without touching the database;
-- the drain is over when the last client has stopped.  Not \shell false: a
-- shell command forks and blocks the pgbench thread that runs ten clients,
-- and twenty forks at the end of a half-second window delayed the clients
-- still finishing.  The client sleeps a second first, so that its backend
-- exits after the window, not while the other clients finish their last
-- jobs (a worker pool does not disconnect on an empty poll); the aborted
-- transaction is not logged, so the window ends with the last completion
-- (docs/benchmarks.md, "The clients' stop").  An empty claim means every job is
-- completed or held by a client that will complete it, since each client
-- completes its own batch before it claims again.  With stop=0 the client
-- sleeps :poll ms and polls again.
-- Variables: queue, batch, stop (0/1), poll (ms).
-- prepared per client: 2 (the claim, and one of the two completes; see bench/run pgb)
SELECT count(*) AS n,
       coalesce(min(id), 0) AS id1,
       coalesce(min(token), 0) AS tok1,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks
  FROM pgjq.claim(:queue, :batch) \gset
\if :n = 0
  \if :stop
    \sleep 1000 ms
    \set stop_now 1 / 0
  \endif
  \sleep :poll ms
\elif :batch = 1
SELECT pgjq.complete(:id1::bigint, :tok1::bigint);
\else
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]);
\endif
