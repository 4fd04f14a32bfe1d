-- bench/spike/scripts/chk_cycle.sql (bench/spike/check): a worker on the
-- fused call: complete_and_claim completes the batch held in ids/toks and
-- claims the next, recorded in chk.claimed.  One cycle in ten rolls back:
-- its completions must stay open and its claims come back; the client keeps
-- its old batch (the results go to x_* variables) and completes it next time.
-- Variables: stop (0/1), poll (ms), ids and toks ('{}' at the start).
\set rb random(1, 10)
BEGIN;
\if :rb = 1
WITH c AS (INSERT INTO chk.claimed SELECT id, token, payload FROM pgjq.complete_and_claim('q', :ids::bigint[], :toks::bigint[], 10) RETURNING id, token)
SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS toks FROM c \gset x_
ROLLBACK;
\else
WITH c AS (INSERT INTO chk.claimed SELECT id, token, payload FROM pgjq.complete_and_claim('q', :ids::bigint[], :toks::bigint[], 10) RETURNING id, token)
SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(token), '{}') AS toks FROM c \gset
COMMIT;
\if :n = 0
  \if :stop
    \shell false
  \endif
  \sleep :poll ms
\endif
\endif
