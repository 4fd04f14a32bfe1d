-- bench/scripts/enqueue.sql: one job per transaction (E2, and the producers
-- of L1 and M1).  The payload carries the enqueue time t (Unix epoch,
-- seconds) so workers can measure enqueue-to-claim and end-to-end latency.
-- Variables: queue.
-- prepared per client: 1 (statements a client prepares; see bench/run pgb)
SELECT pgjq.enqueue(:queue, jsonb_build_object('t', extract(epoch FROM clock_timestamp())));
