-- bench/spike/scripts/commit.sql (bench/spike/run, scenario CEIL): the
-- commit ceiling of the machine: each transaction takes an xid, so it writes
-- a commit record and waits for its flush, and does nothing else.
-- prepared per client: 1
SELECT pg_current_xact_id();
