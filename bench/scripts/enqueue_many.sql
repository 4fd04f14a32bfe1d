-- bench/scripts/enqueue_many.sql: :batch jobs in one call and one
-- transaction (E1 with batch 10000, E3 with batch 100).
-- Variables: queue, batch.
-- prepared per client: 1 (statements a client prepares; see bench/run pgb)
SELECT count(*)
  FROM pgjq.enqueue_many(:queue,
         (SELECT array_agg(jsonb_build_object('t', extract(epoch FROM clock_timestamp())))
            FROM generate_series(1, :batch)));
