-- The end of the pgTAP group: whatever the files before did, pgjq.verify()
-- finds shared memory and the tables in agreement.

\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off

SELECT plan(1);
SELECT is_empty($$SELECT * FROM pgjq.verify()$$, 'verify() finds nothing wrong');
SELECT * FROM finish();
