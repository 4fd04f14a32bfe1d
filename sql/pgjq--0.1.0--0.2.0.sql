/*
 * pgjq: update from 0.1.0 to 0.2.0 (ALTER EXTENSION pgjq UPDATE).
 *
 * 0.2.0 hardens 0.1.0 (see CHANGELOG.md); its tables are those of 0.1.0, so
 * no data moves.  Every object whose definition changed is redefined here,
 * so that an updated installation is the same as a new one: the upgrade
 * test (test/t/070_upgrade_dump.pl) compares the two schemas object by object.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.2.0'" to load this file. \quit

/*
 * The history tables lose their partitioned indexes (which made pg_restore
 * fail) and every existing partition gets the same indexes of its own, under
 * the names the C code gives new partitions.
 */
DROP INDEX pgjq.job_done_id_idx;
DROP INDEX pgjq.job_history_id_idx;
DROP INDEX pgjq.job_history_dead_idx;

DO $partitions$
DECLARE
	p record;
BEGIN
	FOR p IN
		SELECT c.relname AS name, parent.relname AS parent
		  FROM pg_catalog.pg_inherits i
		  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
		  JOIN pg_catalog.pg_class parent ON parent.oid OPERATOR(pg_catalog.=) i.inhparent
		 WHERE i.inhparent OPERATOR(pg_catalog.=) ANY (ARRAY['pgjq.job_done'::pg_catalog.regclass,
														 'pgjq.job_history'::pg_catalog.regclass])
	LOOP
		IF p.parent OPERATOR(pg_catalog.=) 'job_done' THEN
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I USING brin (min_id, max_id)',
									  p.name OPERATOR(pg_catalog.||) '_id_idx', p.name);
		ELSE
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I (id)',
									  p.name OPERATOR(pg_catalog.||) '_id_idx', p.name);
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I (queue_id) WHERE state OPERATOR(pg_catalog.=) %L',
									  p.name OPERATOR(pg_catalog.||) '_dead_idx', p.name, 'd');
		END IF;
	END LOOP;
END
$partitions$;
