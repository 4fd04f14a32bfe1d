/*-------------------------------------------------------------------------
 *
 * bgworker.h
 *	  The launcher and the per-database workers (bgworker.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_BGWORKER_H
#define PGJQ_BGWORKER_H

#include "common/pgjq_common.h"

/* register the launcher (from _PG_init, preloaded only) */
extern void pgjq_bgworker_init(void);
extern PGDLLEXPORT void pgjq_launcher_main(Datum main_arg);
extern PGDLLEXPORT void pgjq_worker_main(Datum main_arg);

#endif							/* PGJQ_BGWORKER_H */
