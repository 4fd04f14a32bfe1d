/*-------------------------------------------------------------------------
 *
 * args.h
 *	  Argument checks shared by the SQL-callable functions.
 *
 * Every function validates its arguments here before touching storage, so a
 * bad argument raises a clear error with the argument's name and leaves no
 * trace.  NULL for an optional argument means its default.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_ARGS_H
#define PGJQ_ARGS_H

#include "common/pgjq_common.h"

#include "utils/array.h"
#include "utils/timestamp.h"

#define USECS_PER_YEAR	(INT64CONST(365) * USECS_PER_DAY)

extern void pgjq_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *argname);
extern char *pgjq_arg_queue_name(FunctionCallInfo fcinfo, int argno);
extern int64 pgjq_arg_interval(FunctionCallInfo fcinfo, int argno, const char *argname,
							   int64 min_us, bool min_inclusive, int64 max_us, int64 default_us);
extern char *pgjq_arg_text(FunctionCallInfo fcinfo, int argno, const char *argname, int maxlen);
extern void pgjq_check_key(text *key, const char *argname, int maxlen);
extern void pgjq_check_payload(Datum payload, const char *argname);
extern ArrayType *pgjq_arg_array(FunctionCallInfo fcinfo, int argno, const char *argname,
								 Oid elemtype, bool required);
extern int	pgjq_array_length(ArrayType *arr);

/* an interval in microseconds (30-day months), clamped */
extern int64 pgjq_interval_usec(const Interval *iv);



#include "funcapi.h"

extern void pgjq_srf_materialize(FunctionCallInfo fcinfo);
extern int64 pgjq_backoff_us(int64 base_us, int64 max_us, int32 attempt);
#endif							/* PGJQ_ARGS_H */
