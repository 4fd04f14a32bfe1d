-- bench/scripts/claim_hold.sql: the claim phase of W1/W2: one claim(10) per
-- transaction with a long lease; the (id, token) pairs go to bench.held
-- (UNLOGGED: no WAL) for the completion phase.
-- Variables: queue.
-- prepared per client: 1 (statements a client prepares; see bench/run pgb)
INSERT INTO bench.held (id, token) SELECT id, token FROM pgjq.claim(:queue, 10, lease => '1 hour');
