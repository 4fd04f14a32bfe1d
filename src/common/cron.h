/*-------------------------------------------------------------------------
 *
 * cron.h
 *	  Cron expressions for periodic jobs (schedule.c): parsing, and the
 *	  slot after a given time in a time zone.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_CRON_H
#define PGJQ_CRON_H

#include "common/pgjq_common.h"

#include "datatype/timestamp.h"
#include "pgtime.h"

typedef struct PgjqCron
{
	int64		every_us;		/* "@every N unit": slots at multiples of it
								 * since the Unix epoch; 0: a cron spec */
	uint64		minutes;		/* bit m: minute m (0-59) */
	uint32		hours;			/* bit h (0-23) */
	uint32		days;			/* bit d (1-31) */
	uint16		months;			/* bit m (1-12) */
	uint8		weekdays;		/* bit w (0-6, Sunday 0) */
	bool		days_star;		/* day of month was "*" */
	bool		weekdays_star;	/* day of week was "*" */
} PgjqCron;

/* Parse a cron expression; an error names the field that is wrong. */
extern void pgjq_cron_parse(const char *expr, PgjqCron *cron);

/* The time zone named, or an error naming argname. */
extern pg_tz *pgjq_cron_zone(const char *name, const char *argname);

/*
 * The first slot strictly after `after`.  Cron specs match wall-clock times
 * in tz: a time a spring-forward day skips does not occur that day, and one
 * a fall-back day repeats fires once (at its first occurrence).  DT_NOEND
 * when there is none within 5 years (say, February 30th).
 */
extern TimestampTz pgjq_cron_next(const PgjqCron *cron, pg_tz *tz, TimestampTz after);

#endif							/* PGJQ_CRON_H */
