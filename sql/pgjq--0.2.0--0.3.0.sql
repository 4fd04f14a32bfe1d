/*
 * pgjq: update from 0.2.0 to 0.3.0 (ALTER EXTENSION pgjq UPDATE).
 *
 * 0.3.0 makes the ring engine durable across restarts (see CHANGELOG.md):
 * every object whose definition changed is redefined here, so that an
 * updated installation is the same as a new one (test/t/070_upgrade_dump.pl
 * compares the two schemas object by object).
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.3.0'" to load this file. \quit

/*
 * The ring's order is durable (review of 0.2.0, C1): each slot's log gets a
 * 'g' row with the slot's generation when producers move to it, and the
 * rebuild orders the slots by it.  The kinds also admit 'r' (the ids of
 * relocated copies), which 0.2.0 wrote but its CHECK did not list, so that
 * a dump holding such rows failed to restore.  Slots 0.2.0 wrote have no
 * 'g' row: the first rebuild orders them as 0.2.0 did, older than any slot
 * written since.
 */
ALTER TABLE pgjq.ring_log_0 DROP CONSTRAINT ring_log_0_kind_check,
	ADD CONSTRAINT ring_log_0_kind_check CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x', 'r', 'g'));
ALTER TABLE pgjq.ring_log_1 DROP CONSTRAINT ring_log_0_kind_check,
	ADD CONSTRAINT ring_log_0_kind_check CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x', 'r', 'g'));
ALTER TABLE pgjq.ring_log_2 DROP CONSTRAINT ring_log_0_kind_check,
	ADD CONSTRAINT ring_log_0_kind_check CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x', 'r', 'g'));
ALTER TABLE pgjq.ring_log_3 DROP CONSTRAINT ring_log_0_kind_check,
	ADD CONSTRAINT ring_log_0_kind_check CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x', 'r', 'g'));

/* health() reports the due jobs the ring had no room for (review M3) */
DROP FUNCTION pgjq.health();
/*
 * Who holds back the xmin horizon (the oldest transaction vacuum must keep
 * rows for) and for how long: a session, a prepared transaction or a
 * replication slot; and the due jobs the ring engine had no room for (they
 * wait as ready rows of pgjq.job).  For pgjq_admin: as the extension owner
 * it sees the state and times of every role's sessions (never their query
 * text).
 */
CREATE FUNCTION pgjq.health(
	OUT horizon_holder text,
	OUT horizon_xid xid,
	OUT horizon_age_xacts bigint,
	OUT horizon_age_seconds double precision,
	OUT horizon_held_since timestamptz,
	OUT pid integer,
	OUT backend_type text,
	OUT usename text,
	OUT application_name text,
	OUT state text,
	OUT xact_start timestamptz,
	OUT query_start timestamptz,
	OUT slot_name text,
	OUT gid text,
	OUT ring_refused bigint,
	OUT ring_refused_at timestamptz,
	OUT ring_refused_bound text)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_health';
COMMENT ON FUNCTION pgjq.health() IS 'who holds back the xmin horizon (backend, prepared transaction or replication slot) and its age in transactions and in seconds (seconds NULL when the holder records no start: a slot, a walsender''s feedback; both 0 when nothing holds it); ring_refused: how often since the server started a due job of this database found no room in the ring engine (it waits as a ready row of pgjq.job), the latest at ring_refused_at, for want of ring_refused_bound (queues or lanes)';
REVOKE ALL ON FUNCTION pgjq.health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.health() TO pgjq_admin;
