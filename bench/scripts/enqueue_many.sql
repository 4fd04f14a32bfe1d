-- bench/scripts/enqueue_many.sql: :batch jobs in one call and one
-- transaction (E1 with batch 10000, E3 with batch 100).
-- Variables: queue, batch.
SELECT count(*)
  FROM pgjq.enqueue_many(:queue,
         (SELECT array_agg(jsonb_build_object('t', extract(epoch FROM clock_timestamp())))
            FROM generate_series(1, :batch)));
