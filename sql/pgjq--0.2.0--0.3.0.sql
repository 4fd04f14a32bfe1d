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
