-- bench/scripts/fair.sql: the FL1 worker.  Claims a batch in one transaction
-- and completes it in a second, like drain.sql, and records each job's claim
-- order: the claim statement takes clock_timestamp() per job, and
-- bench.record_claims() stores it with the job's fair_key and token inside
-- the completing statement (UNLOGGED, no extra commit, no WAL).
--
-- An empty claim does not mean the queue is drained here: under pgjq's
-- key_concurrency it may only mean that every key with jobs left is at its
-- limit.  So a client sleeps :poll ms after an empty claim and stops (a
-- failing \set, as in drain.sql) only after :stop empty claims in a
-- row; the runner ends the window at the last completion, not at the stop.
-- Variables: queue, batch, poll (ms), stop (empty claims in a row), empty (0).
-- prepared per client: 2 (statements a client prepares; see bench/run pgb)
SELECT count(*) AS n,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks,
       coalesce(array_agg(fair_key), '{}') AS keys,
       coalesce(array_agg(extract(epoch FROM clock_timestamp())), '{}') AS cat
  FROM pgjq.claim(:queue, :batch) \gset
\if :n = 0
  \set empty :empty + 1
  \if :empty >= :stop
    \set stop_now 1 / 0
  \endif
  \sleep :poll ms
\else
  \set empty 0
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]), bench.record_claims(:cat::float8[], :keys::text[], :toks::bigint[]);
\endif
