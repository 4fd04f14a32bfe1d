/*-------------------------------------------------------------------------
 *
 * pgjq_common.h
 *	  What every pgjq file needs first: postgres.h and fmgr.h, the limits on
 *	  batches and text arguments, and the version shims.
 *
 * Every pgjq header includes this one (directly or through another), so
 * that postgres.h comes first in every file.  Settings are in guc.h, the
 * declarations of each module in the header named for it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_COMMON_H
#define PGJQ_COMMON_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "fmgr.h"

/* The largest batch claim() hands out and the largest enqueue_many() call. */
#define PGJQ_MAX_BATCH			10000
#define PGJQ_MAX_ENQUEUE_MANY	100000

/*
 * The maintenance steps' chunk: the worker does a chunk (or one partition)
 * per transaction (api/maintenance.c; engine/deps.c's events likewise).
 */
#define PGJQ_MAINTENANCE_CHUNK	1000

/* Limits on text arguments, in bytes (documented in README.md). */
#define PGJQ_MAX_QUEUE_NAME		128
#define PGJQ_MAX_KEY			512
#define PGJQ_MAX_WORKER			256
#define PGJQ_MAX_ERROR			8192

/* The differences between PostgreSQL 15 and 18 are in pg_compat.h. */
#include "common/pg_compat.h"

#endif							/* PGJQ_COMMON_H */
