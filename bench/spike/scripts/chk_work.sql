-- bench/spike/scripts/chk_work.sql (bench/spike/check): a worker that claims
-- in one transaction (recording what it got in chk.claimed) and completes in
-- others.  One claim in ten rolls back (the jobs must come back); one first
-- complete in ten rolls back (the jobs must stay in flight: the retry
-- completes them all).  Around it: a complete with wrong tokens before (c0,
-- must be 0) and the same complete again after (c2, stale, must be 0).
-- Variables: stop (0/1), poll (ms).
\set rb random(1, 10)
BEGIN;
WITH c AS (INSERT INTO chk.claimed SELECT id, token, payload FROM pgjq.claim('q', 10) RETURNING id, token)
SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS toks FROM c \gset
\if :rb = 1
ROLLBACK;
\else
COMMIT;
\endif
\if :n = 0
  \if :stop
    \shell false
  \endif
  \sleep :poll ms
\elif :rb != 1
SELECT pgjq.complete(:ids::bigint[], (SELECT array_agg(t + 1000000000) FROM unnest(:toks::bigint[]) t)) AS c0 \gset
BEGIN;
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]) AS c1 \gset
\if :rb = 2
ROLLBACK;
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]) AS c1 \gset
\else
COMMIT;
\endif
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]) AS c2 \gset
INSERT INTO chk.calls VALUES (:n, :c0, :c1, :c2);
\endif
