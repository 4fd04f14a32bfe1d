/*-------------------------------------------------------------------------
 *
 * crash_points.h
 *	  Test-only crash and pause points (crash_points.c names them).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_CRASH_POINTS_H
#define PGJQ_CRASH_POINTS_H

#include "common/pgjq_common.h"

/* the settings pgjq.debug_crash_at and pgjq.debug_pause_at (guc.c registers them) */
extern char *pgjq_debug_crash_at;
extern char *pgjq_debug_pause_at;

/* crash (pgjq.debug_crash_at) or pause (pgjq.debug_pause_at) at `point` */
extern void pgjq_crash_point(const char *point);

#endif							/* PGJQ_CRASH_POINTS_H */
