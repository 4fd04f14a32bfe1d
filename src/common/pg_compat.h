/*-------------------------------------------------------------------------
 *
 * pg_compat.h
 *	  Every difference between the PostgreSQL versions pgjq builds on (15 and
 *	  18), each under the version that made it.  The rest of the code uses
 *	  the one spelling defined here and tests no version itself.
 *
 * The Makefile refuses other major versions with one line; the #error below
 * catches a build that bypasses it.  16 and 17 are not built or tested here,
 * so they are refused too, though most shims are written by the version
 * that changed the API (17 for the vxid and MyProcNumber, say).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_PG_COMPAT_H
#define PGJQ_PG_COMPAT_H

#include "postgres.h"

#include "access/genam.h"
#include "miscadmin.h"
#include "storage/proc.h"

#if PG_VERSION_NUM < 150000 || (PG_VERSION_NUM >= 160000 && PG_VERSION_NUM < 180000) || \
	PG_VERSION_NUM >= 190000
#error "pgjq builds on PostgreSQL 15 and 18 only"
#endif

/*
 * PostgreSQL 18: pg_attribute_noreturn() (after the declarator) gave way to
 * pg_noreturn (before it, as C11's _Noreturn).  GCC and Clang accept the
 * attribute before the declaration too, so 15 gets the same spelling.
 */
#ifndef pg_noreturn
#define pg_noreturn __attribute__((noreturn))
#endif

/*
 * PostgreSQL 17: PGPROC's local transaction id moved into PGPROC.vxid, and
 * a backend's number became MyProcNumber (was MyProc->pgprocno).
 */
#if PG_VERSION_NUM >= 170000
#define PGJQ_MY_LXID		(MyProc->vxid.lxid)
#define PGJQ_MY_PROCNO		MyProcNumber
#else
#define PGJQ_MY_LXID		(MyProc->lxid)
#define PGJQ_MY_PROCNO		(MyProc->pgprocno)
#endif

/*
 * PostgreSQL 18: index_beginscan() takes the scan's instrumentation (NULL:
 * none, as outside EXPLAIN).
 */
#if PG_VERSION_NUM >= 180000
#define pgjq_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define pgjq_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * PostgreSQL 17: index_insert() may keep state between calls in the
 * IndexInfo (BRIN keeps its revmap's buffers pinned there), which
 * index_insert_cleanup() releases; code that inserts index entries itself
 * calls it once done, as the executor's ExecCloseIndices() does (without
 * it, 18 warns at commit of a pin left on job_done's BRIN).  15 keeps no
 * such state.
 */
#if PG_VERSION_NUM >= 170000
#define pgjq_index_insert_cleanup(index, ii)	index_insert_cleanup((index), (ii))
#else
#define pgjq_index_insert_cleanup(index, ii)	((void) 0)
#endif

/*
 * PostgreSQL 18: the IsBackgroundWorker flag gave way to the process's
 * backend type (AmBackgroundWorkerProcess()).
 */
#if PG_VERSION_NUM >= 180000
#define PGJQ_IN_BGWORKER	AmBackgroundWorkerProcess()
#else
#define PGJQ_IN_BGWORKER	IsBackgroundWorker
#endif

/*
 * PostgreSQL 17: an interval may be infinite ('infinity', '-infinity');
 * 15 has no such values.
 */
#if PG_VERSION_NUM >= 170000
#define PGJQ_INTERVAL_IS_NOBEGIN(iv)	INTERVAL_IS_NOBEGIN(iv)
#define PGJQ_INTERVAL_IS_NOEND(iv)		INTERVAL_IS_NOEND(iv)
#else
#define PGJQ_INTERVAL_IS_NOBEGIN(iv)	false
#define PGJQ_INTERVAL_IS_NOEND(iv)		false
#endif

/*
 * PostgreSQL 17: extensions may name their wait events
 * (WaitEventExtensionNew), so pg_stat_activity shows "PgjqClaim" where 15
 * shows the one event "Extension".  common/wait_events.c uses it.
 */
#if PG_VERSION_NUM >= 170000
#define PGJQ_HAVE_CUSTOM_WAIT_EVENTS 1
#endif

#endif							/* PGJQ_PG_COMPAT_H */
