/*-------------------------------------------------------------------------
 *
 * args.c
 *	  Validation of the arguments of pgjq's SQL functions.
 *
 * Errors follow one pattern: the message names the argument, the SQLSTATE
 * says what kind of mistake it is (null_value_not_allowed,
 * invalid_parameter_value, program_limit_exceeded), and the check runs before
 * any write so a rejected call changes nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "common/args.h"

#include "access/detoast.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "miscadmin.h"
#include "common/int.h"
#include "common/pg_compat.h"
#include "common/pg_prng.h"
#include "common/guc.h"

/*
 * Raise null_value_not_allowed when a required argument is NULL.
 */
void
pgjq_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
}

/*
 * Return the queue name argument as a C string, after checking it: 1 to
 * PGJQ_MAX_QUEUE_NAME characters from [A-Za-z0-9_.:-].  Names are data and
 * never reach SQL text, but a narrow alphabet keeps logs, metrics labels and
 * shell scripts safe too.
 */
char *
pgjq_arg_queue_name(FunctionCallInfo fcinfo, int argno)
{
	char	   *name;
	int			len;

	pgjq_arg_not_null(fcinfo, argno, "queue");
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	len = strlen(name);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queue name must not be empty")));
	if (len > PGJQ_MAX_QUEUE_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queue name is too long"),
				 errdetail("A queue name has at most %d characters.", PGJQ_MAX_QUEUE_NAME)));
	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' || c == ':'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("queue name contains an invalid character"),
					 errdetail("A queue name may contain only ASCII letters, digits, \"_\", \"-\", \".\" and \":\".")));
	}
	return name;
}

/*
 * An interval as microseconds, a month counting as 30 days (as PostgreSQL's
 * own interval comparisons do).  Infinite intervals (PostgreSQL 17), and
 * intervals beyond about 292,000 years that do not fit in microseconds, map
 * to PG_INT64_MAX or PG_INT64_MIN so range checks reject them.
 */
int64
pgjq_interval_usec(const Interval *iv)
{
	int64		result;
	int64		days;

	if (PGJQ_INTERVAL_IS_NOBEGIN(iv))
		return PG_INT64_MIN;
	if (PGJQ_INTERVAL_IS_NOEND(iv))
		return PG_INT64_MAX;
	days = (int64) iv->month * DAYS_PER_MONTH + iv->day;	/* cannot overflow */
	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &result))
		return days > 0 ? PG_INT64_MAX : PG_INT64_MIN;
	if (pg_add_s64_overflow(result, iv->time, &result))
		return iv->time > 0 ? PG_INT64_MAX : PG_INT64_MIN;
	return result;
}

static void
describe_limit(StringInfo buf, int64 us)
{
	if (us % USECS_PER_DAY == 0)
		appendStringInfo(buf, INT64_FORMAT " days", us / USECS_PER_DAY);
	else if (us % USECS_PER_SEC == 0)
		appendStringInfo(buf, INT64_FORMAT " seconds", us / USECS_PER_SEC);
	else
		appendStringInfo(buf, INT64_FORMAT " microseconds", us);
}

/*
 * Return an interval argument in microseconds, or default_us when it is NULL.
 * The value must lie in [min_us, max_us] (or (min_us, max_us] when
 * min_inclusive is false).
 */
int64
pgjq_arg_interval(FunctionCallInfo fcinfo, int argno, const char *argname,
				  int64 min_us, bool min_inclusive, int64 max_us, int64 default_us)
{
	int64		us;

	/*
	 * An argument the SQL declaration lacks (an older schema, before ALTER
	 * EXTENSION UPDATE, calling this library) takes its default
	 */
	if (argno >= PG_NARGS() || PG_ARGISNULL(argno))
		return default_us;
	us = pgjq_interval_usec(PG_GETARG_INTERVAL_P(argno));
	if (us < min_us || (!min_inclusive && us == min_us) || us > max_us)
	{
		StringInfoData lo;
		StringInfoData hi;

		initStringInfo(&lo);
		initStringInfo(&hi);
		describe_limit(&lo, min_us);
		describe_limit(&hi, max_us);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is out of range", argname),
				 min_inclusive ?
				 errdetail("%s must be between %s and %s.", argname, lo.data, hi.data) :
				 errdetail("%s must be greater than %s and at most %s.", argname, lo.data, hi.data)));
	}
	return us;
}

/*
 * Return an optional text argument as a C string (NULL when NULL), at most
 * maxlen bytes.
 */
char *
pgjq_arg_text(FunctionCallInfo fcinfo, int argno, const char *argname, int maxlen)
{
	text	   *t;

	if (PG_ARGISNULL(argno))
		return NULL;
	t = PG_GETARG_TEXT_PP(argno);
	pgjq_check_key(t, argname, maxlen);
	return text_to_cstring(t);
}

/*
 * Check the length of a fair_key, dedup_key or worker value.
 */
void
pgjq_check_key(text *key, const char *argname, int maxlen)
{
	if (VARSIZE_ANY_EXHDR(key) > maxlen)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", argname),
				 errdetail("%s has at most %d bytes.", argname, maxlen)));
}

/*
 * Check a payload against pgjq.max_payload_size: its size as jsonb before
 * any compression, so that a client can tell in advance whether a payload
 * fits (what TOAST later makes of it depends on the data).
 */
void
pgjq_check_payload(Datum payload, const char *argname)
{
	Size		size = toast_raw_datum_size(payload);

	if (size > (Size) pgjq_max_payload_size * 1024)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large", argname),
				 errdetail("The payload has %zu bytes; pgjq.max_payload_size allows %d kB.",
						   size, pgjq_max_payload_size)));
}

/*
 * Fetch a one-dimensional array argument.  A NULL array is an error when
 * required, else returns NULL.  Multi-dimensional arrays are rejected; an
 * empty array comes back as is.
 */
ArrayType *
pgjq_arg_array(FunctionCallInfo fcinfo, int argno, const char *argname,
			   Oid elemtype, bool required)
{
	ArrayType  *arr;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			pgjq_arg_not_null(fcinfo, argno, argname);
		return NULL;
	}
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_ELEMTYPE(arr) != elemtype)
		elog(ERROR, "unexpected element type %u in %s", ARR_ELEMTYPE(arr), argname);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", argname)));
	return arr;
}

int
pgjq_array_length(ArrayType *arr)
{
	if (arr == NULL || ARR_NDIM(arr) == 0)
		return 0;
	return ARR_DIMS(arr)[0];
}

/*
 * Set up fcinfo's ReturnSetInfo for materialize mode: rsinfo->setResult and
 * rsinfo->setDesc are ready for tuplestore_putvalues().
 */
void
pgjq_srf_materialize(FunctionCallInfo fcinfo)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	Oid			rettype;
	MemoryContext old;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		!(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	switch (get_call_result_type(fcinfo, &rettype, &tupdesc))
	{
		case TYPEFUNC_COMPOSITE:
			tupdesc = CreateTupleDescCopy(tupdesc);
			break;
		case TYPEFUNC_SCALAR:
			tupdesc = CreateTemplateTupleDesc(1);
			TupleDescInitEntry(tupdesc, (AttrNumber) 1, "value", rettype, -1, 0);
			break;
		default:
			elog(ERROR, "pgjq: unexpected return type of a set-returning function");
	}
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->setDesc = tupdesc;
	MemoryContextSwitchTo(old);
}

/*
 * The delay before retry number `attempt` (1-based) of a failed job:
 * base * 2^(attempt-1), capped at max, then lowered by a random share of up
 * to 25% so that jobs failing together do not all come back together.
 */
int64
pgjq_backoff_us(int64 base_us, int64 max_us, int32 attempt)
{
	int64		delay = base_us;
	double		r;

	for (int i = 1; i < attempt && delay < max_us; i++)
	{
		if (delay > PG_INT64_MAX / 2)
		{
			delay = max_us;
			break;
		}
		delay *= 2;
	}
	if (delay > max_us)
		delay = max_us;
	r = pg_prng_double(&pg_global_prng_state);
	return delay - (int64) (delay * 0.25 * r);
}
