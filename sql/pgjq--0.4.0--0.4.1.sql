/*
 * pgjq 0.4.0 -> 0.4.1: nothing lost in a move (issue 35, the review of
 * 0.4.0).  The Citus mode's move and guard are rebuilt; nothing changes for
 * a single server's jobs or calls.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.4.1'" to load this file. \quit
