/*
 * bench/lib/bench.sql: the benchmark's own objects, installed by bench/run
 * into each system's database (pgjq's and the baseline's alike).
 *
 * Latency samples are written by the workers' pgbench scripts inside the
 * statement that reports the jobs' outcome, so they add no transaction and
 * no commit.  The table is UNLOGGED, so writing it adds no WAL, and schema
 * bench is outside the tuple accounting (which counts schema pgjq only).
 * What the samples do cost is a little CPU inside the workers' statements,
 * the same for both systems.
 */

CREATE SCHEMA bench;

/*
 * one row per job: v = a latency in seconds, at = when it was recorded;
 * FL1 (bench.record_claims) stores v = the claim time (epoch), k = the job's
 * fair_key and tok = its claim's token instead
 */
CREATE UNLOGGED TABLE bench.sample (
	v				float8 NOT NULL,
	at				float8 NOT NULL,
	k				text,
	tok				bigint
) WITH (autovacuum_enabled = false);

/* record latencies measured by the caller (seconds) */
CREATE FUNCTION bench.record(lat float8[])
RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
	IF cardinality(lat) > 0 THEN
		INSERT INTO bench.sample (v, at)
		SELECT x, extract(epoch FROM clock_timestamp()) FROM unnest(lat) x;
	END IF;
	RETURN coalesce(cardinality(lat), 0);
END
$$;

/*
 * record pickups measured by the caller: v = the pickup (seconds), at = when
 * the claim saw the job (epoch), so at - v is the job's enqueue time t: L1W
 * matches it with the producer's transaction that enqueued it
 */
CREATE FUNCTION bench.record_pickups(lat float8[], claimed_at float8[])
RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
	IF cardinality(lat) > 0 THEN
		INSERT INTO bench.sample (v, at) SELECT u.l, u.c FROM unnest(lat, claimed_at) AS u(l, c);
	END IF;
	RETURN coalesce(cardinality(lat), 0);
END
$$;

/* record now - t for each epoch t (seconds), e.g. enqueue-to-completion */
CREATE FUNCTION bench.record_since(t float8[])
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
	now_e	float8 := extract(epoch FROM clock_timestamp());
BEGIN
	IF cardinality(t) > 0 THEN
		INSERT INTO bench.sample (v, at) SELECT now_e - x, now_e FROM unnest(t) x;
	END IF;
	RETURN coalesce(cardinality(t), 0);
END
$$;

/*
 * record, per claimed job, when it was claimed (epoch, measured by the
 * caller in the claim statement), its fair_key and its claim's token: the
 * claim order of FL1
 */
CREATE FUNCTION bench.record_claims(claimed_at float8[], keys text[], toks bigint[])
RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
	IF cardinality(claimed_at) > 0 THEN
		INSERT INTO bench.sample (v, at, k, tok)
		SELECT u.c, extract(epoch FROM clock_timestamp()), u.k, u.t
		  FROM unnest(claimed_at, keys, toks) AS u(c, k, t);
	END IF;
	RETURN coalesce(cardinality(claimed_at), 0);
END
$$;

/*
 * Cumulative tuple counters over the system's own tables: every table in
 * schema pgjq, partitions included (pgjq's history partitions live there).
 */
CREATE FUNCTION bench.counters(
	OUT ins bigint, OUT upd bigint, OUT hot bigint, OUT del bigint,
	OUT dead bigint, OUT rels integer)
LANGUAGE sql
AS $$
	SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint,
		   coalesce(sum(n_tup_hot_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint,
		   coalesce(sum(n_dead_tup), 0)::bigint, count(*)::integer
	  FROM pg_catalog.pg_stat_all_tables
	 WHERE schemaname = 'pgjq'
$$;

/* size of the system's tables and indexes, in bytes */
CREATE FUNCTION bench.footprint()
RETURNS bigint
LANGUAGE sql
AS $$
	SELECT coalesce(sum(pg_catalog.pg_total_relation_size(c.oid)), 0)::bigint
	  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'pgjq' AND c.relkind = 'r'
$$;

/* S1: the part of footprint() that is finished-job history (pgjq only) */
CREATE FUNCTION bench.footprint_history()
RETURNS bigint
LANGUAGE sql
AS $$
	SELECT coalesce(sum(pg_catalog.pg_total_relation_size(c.oid)), 0)::bigint
	  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'pgjq' AND c.relkind = 'r' AND c.relname ~ '^job_(done|history)'
$$;

/*
 * W1/W2: the (id, token) of the jobs claimed in the claim phase, kept for
 * the completion phase.  UNLOGGED, so keeping them adds no WAL: each phase's
 * WAL is the system's alone.
 */
CREATE UNLOGGED TABLE bench.held (
	id				bigint NOT NULL,
	token			bigint NOT NULL
) WITH (autovacuum_enabled = false);
