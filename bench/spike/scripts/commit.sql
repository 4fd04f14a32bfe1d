-- bench/spike/scripts/commit.sql (bench/spike/run, scenario CEIL): the
-- commit ceiling of the machine: a one-row INSERT per transaction (a
-- transaction must write WAL besides its commit record to wait for the flush).
-- prepared per client: 1
INSERT INTO public.ceil VALUES (1);
