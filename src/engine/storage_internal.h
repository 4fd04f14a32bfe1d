/*-------------------------------------------------------------------------
 *
 * storage_internal.h
 *	  Helpers shared by the storage_*.c files only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_STORAGE_INTERNAL_H
#define PGJQ_STORAGE_INTERNAL_H

#include "common/spi_plans.h"
#include "engine/engine.h"

#include "catalog/pg_type.h"
#include "utils/timestamp.h"

/* Where results handed back to the API layer are allocated. */
extern MemoryContext pgjq_result_cxt;

extern Datum pgjq_interval_datum(int64 us);
extern Oid	pgjq_namespace(void);
extern Oid	pgjq_relation(const char *name);

#endif							/* PGJQ_STORAGE_INTERNAL_H */
