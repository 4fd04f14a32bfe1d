/*
 * pgjq: update from 0.2.0 to 0.3.0 (ALTER EXTENSION pgjq UPDATE).
 *
 * 0.3.0 makes the ring engine durable across restarts (see CHANGELOG.md):
 * every object whose definition changed is redefined here, so that an
 * updated installation is the same as a new one (test/t/070_upgrade_dump.pl
 * compares the two schemas object by object).
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.3.0'" to load this file. \quit
