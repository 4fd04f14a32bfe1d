-- bench/scripts/pickup_wait.sql: pickup.sql with a server-side wait instead
-- of polling (L1W, pgjq only: the baseline's claim has no wait).
--
-- claim(..., wait => :wait) sleeps in the server until a producer's commit
-- makes a job claimable, then claims; a wait that times out returns nothing
-- and the worker simply claims again (no client-side sleep).  As in
-- pickup.sql, the claim statement computes clock_timestamp() minus the
-- payload's enqueue time t per job, and bench.record_pickups() stores it,
-- with the time the claim saw the job, inside the completing statement
-- (UNLOGGED, no extra commit, no WAL): bench/run splits each pickup at the
-- moment the producer's enqueue transaction returned.
-- Variables: queue, batch, wait (interval text).
-- prepared per client: 2 (statements a client prepares; see bench/run pgb)
SELECT count(*) AS n,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(token), '{}') AS toks,
       coalesce(array_agg(extract(epoch FROM clock_timestamp()) - (payload->>'t')::float8), '{}') AS lat,
       coalesce(array_agg(extract(epoch FROM clock_timestamp())), '{}') AS cat
  FROM pgjq.claim(:queue, :batch, wait => :wait::interval) \gset
\if :n > 0
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]), bench.record_pickups(:lat::float8[], :cat::float8[]);
\endif
