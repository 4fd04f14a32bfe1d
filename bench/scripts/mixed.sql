-- bench/scripts/mixed.sql: the M1 worker.  Claims a batch, then reports all
-- outcomes in one statement (its second transaction): a fraction :fail of
-- the jobs (chosen at random) fails with retry_in :retry, the rest complete.
-- For each completed job, bench.record_since() stores enqueue-to-completion
-- time (the payload's t) in the UNLOGGED sample table, in the same
-- statement: no extra commit, no WAL.
-- An empty claim sleeps :poll ms before polling again.
-- Variables: queue, batch, poll (ms), fail (0..1), retry (interval text).
-- prepared per client: 2 (statements a client prepares; see bench/run pgb)
SELECT count(*) AS n,
       coalesce(array_agg(id) FILTER (WHERE NOT bad), '{}') AS ok_ids,
       coalesce(array_agg(token) FILTER (WHERE NOT bad), '{}') AS ok_toks,
       coalesce(array_agg((payload->>'t')::float8) FILTER (WHERE NOT bad), '{}') AS ok_t,
       coalesce(array_agg(id) FILTER (WHERE bad), '{}') AS bad_ids,
       coalesce(array_agg(token) FILTER (WHERE bad), '{}') AS bad_toks
  FROM (SELECT c.*, random() < :fail AS bad FROM pgjq.claim(:queue, :batch) c) j \gset
\if :n = 0
  \sleep :poll ms
\else
SELECT pgjq.complete(:ok_ids::bigint[], :ok_toks::bigint[]),
       (SELECT count(*)
          FROM unnest(:bad_ids::bigint[], :bad_toks::bigint[]) AS u(id, token),
               LATERAL pgjq.fail(u.id, u.token, 'bench: simulated failure', :retry::interval) AS f),
       bench.record_since(:ok_t::float8[]);
\endif
