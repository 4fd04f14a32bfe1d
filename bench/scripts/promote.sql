-- bench/scripts/promote.sql: stands in for pgjq's background worker when it
-- is not running: makes due scheduled jobs ready every :poll ms.  bench/run
-- uses it only for pgjq and only when no pgjq background worker is found;
-- its transactions then count as pgjq's, as the worker's would.
-- Variables: poll (ms).
-- prepared per client: 1 (statements a client prepares; see bench/run pgb)
SELECT pgjq.promote();
\sleep :poll ms
