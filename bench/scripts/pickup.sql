-- bench/scripts/pickup.sql: a polling worker that measures how long each job
-- waited (L1: enqueue to claim; F1: run_at to claim, i.e. lateness).
--
-- The claim statement computes, per job, clock_timestamp() minus the time t
-- carried in its payload.  The values are stored by bench.record() inside the
-- completing statement (second transaction), into an UNLOGGED table outside
-- schema pgjq: no extra transaction, no commit, no WAL, no counted tuple.
-- An empty claim sleeps :poll ms before polling again.
-- Variables: queue, batch, poll (ms).
-- prepared per client: 2 (statements a client prepares; see bench/run pgb)
SELECT count(*) AS n,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks,
       coalesce(array_agg(extract(epoch FROM clock_timestamp()) - (payload->>'t')::float8), '{}') AS lat
  FROM pgjq.claim(:queue, :batch) \gset
\if :n = 0
  \sleep :poll ms
\else
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]), bench.record(:lat::float8[]);
\endif
