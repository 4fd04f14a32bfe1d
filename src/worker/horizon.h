/*-------------------------------------------------------------------------
 *
 * horizon.h
 *	  The vacuum horizon guard (horizon.c): the worker's once-per-pass check.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_HORIZON_H
#define PGJQ_HORIZON_H

#include "common/pgjq_common.h"

/* bgworker.c calls it once per pass, inside a transaction with a snapshot */
extern int64 pgjq_horizon_check(void);

#endif							/* PGJQ_HORIZON_H */
