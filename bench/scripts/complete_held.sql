-- bench/scripts/complete_held.sql: the completion phase of W1/W2: ten held
-- jobs completed by one complete(ids[], tokens[]) per transaction.  Taking
-- them out of bench.held (UNLOGGED) adds no WAL.
-- prepared per client: 1 (statements a client prepares; see bench/run pgb)
WITH d AS (DELETE FROM bench.held h
            WHERE h.ctid = ANY (ARRAY(SELECT ctid FROM bench.held LIMIT 10))
        RETURNING h.id, h.token)
SELECT pgjq.complete(array_agg(id), array_agg(token)) FROM d;
