/*-------------------------------------------------------------------------
 *
 * pgjq.c
 *	  Module entry point: a thin _PG_init that calls each module's init.
 *
 * Loaded through shared_preload_libraries, pgjq reserves shared memory and
 * registers its background worker launcher; loaded on demand (first call of a
 * pgjq function), it only defines its settings and everything that does not
 * need shared memory works.
 *
 *-------------------------------------------------------------------------
 */
#include "common/pgjq.h"
#include "common/spi_plans.h"

#include "miscadmin.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	pgjq_guc_init();
	pgjq_spi_plans_init();
	if (!process_shared_preload_libraries_in_progress)
		return;
	pgjq_shmem_init();
	pgjq_bgworker_init();
}
