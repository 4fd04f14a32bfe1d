-- bench/spike/scripts/chk_crash_work.sql (bench/spike/check, crash phase): a
-- worker with short leases.  Claims 10 with a 3 s lease (recorded in
-- chk.claimed in the claim's transaction); in one batch in five the first
-- job fails (it comes back with attempt + 1) and the rest complete; one
-- call in ten is a rescue of expired leases, as the background worker would
-- run it.  Variables: stop (0/1), poll (ms).
\set k random(1, 10)
\if :k = 1
SELECT pgjq.rescue(100) AS r \gset
\endif
BEGIN;
WITH c AS (INSERT INTO chk.claimed SELECT id, token, payload FROM pgjq.claim('q', 10, '3 seconds') RETURNING id, token)
SELECT count(*) AS n, coalesce(array_agg(id ORDER BY id), '{}') AS ids, coalesce(array_agg(token ORDER BY id), '{}') AS toks FROM c \gset
COMMIT;
\if :n = 0
  \if :stop
    \shell false
  \endif
  \sleep :poll ms
\elif :k <= 2
SELECT pgjq.fail((:ids::bigint[])[1], (:toks::bigint[])[1], 'chk') AS f \gset
SELECT pgjq.complete((:ids::bigint[])[2:], (:toks::bigint[])[2:]) AS c \gset
\else
SELECT pgjq.complete(:ids::bigint[], :toks::bigint[]) AS c \gset
\endif
