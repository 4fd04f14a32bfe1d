/*
 * bench/lib/monitor.sql: installed by bench/run into database "postgres",
 * from where it watches the systems' databases.  Reading from another
 * database keeps the measurement's own transactions out of the measured
 * database's commit count; reading the WAL position writes no WAL.
 */

/*
 * bench_settle(db): wait until the statistics of database db have settled,
 * then return its commit and session counts and the WAL insert position.
 *
 * A backend flushes its statistics when it exits, before it leaves
 * pg_stat_activity, so first wait until no client backend is left in db
 * (the horizon-pinning session of scenario H1 excepted), then until the
 * commit count has not moved for quiet_ms (background workers and
 * autovacuum may keep it moving: give up waiting after max_ms).
 */
CREATE FUNCTION bench_settle(db name, quiet_ms integer DEFAULT 150, max_ms integer DEFAULT 3000,
							 OUT commits bigint, OUT sessions bigint, OUT lsn pg_lsn,
							 OUT waited_ms integer)
LANGUAGE plpgsql
AS $$
DECLARE
	t0		timestamptz := clock_timestamp();
	since	timestamptz := clock_timestamp();
	prev	bigint := -1;
BEGIN
	LOOP
		PERFORM pg_stat_clear_snapshot();
		EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity
							   WHERE datname = db AND backend_type = 'client backend'
								 AND application_name <> 'bench-pin');
		EXIT WHEN clock_timestamp() - t0 > max_ms * interval '1 ms';
		PERFORM pg_sleep(0.02);
	END LOOP;
	LOOP
		PERFORM pg_stat_clear_snapshot();
		SELECT d.xact_commit, d.sessions INTO commits, sessions
		  FROM pg_stat_database d WHERE d.datname = db;
		IF commits IS DISTINCT FROM prev THEN
			prev := commits;
			since := clock_timestamp();
		ELSIF clock_timestamp() - since >= quiet_ms * interval '1 ms' THEN
			EXIT;
		END IF;
		EXIT WHEN clock_timestamp() - t0 > max_ms * interval '1 ms';
		PERFORM pg_sleep(0.02);
	END LOOP;
	lsn := pg_current_wal_insert_lsn();
	waited_ms := (extract(epoch FROM clock_timestamp() - t0) * 1000)::integer;
END
$$;
