/*
 * pgjq 0.4.0 -> 0.4.1: nothing lost in a move (issue 35, the review of
 * 0.4.0).  The Citus mode's move and guard are rebuilt; nothing changes for
 * a single server's jobs or calls.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.4.1'" to load this file. \quit

/*
 * First: the extension's lock, so that the background worker steps aside
 * until this update commits (issue 35, finding 6: DDL and the worker took
 * pgjq's tables in different orders and deadlocked).  Every later update
 * script begins with SELECT pgjq._exclude_worker().
 */
/*
 * Internal: the first statement of every update script (from 0.4.1 on): the
 * extension's lock, so that the background worker steps aside until the
 * update commits (src/worker/bgworker.c).  Superuser only.
 */
CREATE FUNCTION pgjq._exclude_worker()
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_exclude_worker';
REVOKE ALL ON FUNCTION pgjq._exclude_worker() FROM PUBLIC;
SELECT pgjq._exclude_worker();
