/*-------------------------------------------------------------------------
 *
 * cron.c
 *	  Cron expressions for periodic jobs: five fields (minute, hour, day of
 *	  month, month, day of week) with lists, ranges, steps and month and
 *	  weekday names; the aliases @yearly, @annually, @monthly, @weekly,
 *	  @daily, @midnight, @hourly; and "@every N seconds|minutes|hours".
 *
 * Slots of a cron spec are wall-clock minutes in the schedule's time zone,
 * found by walking UTC minutes (skipping whole hours that cannot match) and
 * reading each one's local time with pg_localtime, so daylight-saving
 * changes need no special arithmetic: a wall time that a spring-forward day
 * skips is never seen, and one that a fall-back day repeats is seen twice,
 * the second time recognised (the same wall time an offset change ago) and
 * passed over.  As in Vixie cron, when both day fields are restricted a day
 * matches either.  "@every" slots are multiples of the period since the
 * Unix epoch, in absolute time.
 *
 *-------------------------------------------------------------------------
 */
#include "common/cron.h"

#include "utils/datetime.h"
#include "utils/timestamp.h"

#include <ctype.h>

typedef struct CronField
{
	const char *name;
	int			lo;
	int			hi;
	const char *const *names;	/* names for lo.., or NULL */
} CronField;

static const char *const month_names[] = {
	"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec", NULL
};
static const char *const weekday_names[] = {
	"sun", "mon", "tue", "wed", "thu", "fri", "sat", NULL
};

static const CronField fields[5] = {
	{"minute", 0, 59, NULL},
	{"hour", 0, 23, NULL},
	{"day of month", 1, 31, NULL},
	{"month", 1, 12, month_names},
	{"day of week", 0, 7, weekday_names},	/* 7 is Sunday too */
};

pg_noreturn static void
bad_field(const char *expr, const CronField *f, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid cron expression \"%s\"", expr),
			 errdetail("Field \"%s\": %s.", f->name, why)));
}

/* A number or (where the field has them) a name at *p; advances *p. */
static int
field_value(const char *expr, const CronField *f, const char **p)
{
	const char *s = *p;

	if (isdigit((unsigned char) *s))
	{
		long		v = 0;

		while (isdigit((unsigned char) *s))
		{
			v = v * 10 + (*s - '0');
			if (v > 1000)
				break;
			s++;
		}
		if (v < f->lo || v > f->hi)
			bad_field(expr, f, psprintf("%ld is out of range %d-%d", v, f->lo, f->hi));
		*p = s;
		return (int) v;
	}
	if (f->names && isalpha((unsigned char) *s))
	{
		for (int i = 0; f->names[i]; i++)
			if (pg_strncasecmp(s, f->names[i], 3) == 0 && !isalpha((unsigned char) s[3]))
			{
				*p = s + 3;
				return f->lo + i;
			}
	}
	bad_field(expr, f, psprintf("\"%s\" is not a value", s));
}

/* One field's text (NUL-terminated) into a bit set of lo..hi. */
static uint64
parse_field(const char *expr, const CronField *f, const char *text)
{
	uint64		bits = 0;
	const char *p = text;

	for (;;)
	{
		int			a,
					b,
					step = 1;
		bool		single = false;

		if (*p == '*')
		{
			a = f->lo;
			b = f->hi;
			p++;
		}
		else
		{
			a = field_value(expr, f, &p);
			b = a;
			single = true;
			if (*p == '-')
			{
				p++;
				single = false;
				b = field_value(expr, f, &p);
				if (b < a)
					bad_field(expr, f, psprintf("the range %d-%d is reversed", a, b));
			}
		}
		if (*p == '/')
		{
			const char *s = ++p;
			long		v = 0;

			if (!isdigit((unsigned char) *s))
				bad_field(expr, f, "a step must be a number");
			while (isdigit((unsigned char) *s) && v <= 1000)
				v = v * 10 + (*s++ - '0');
			if (v < 1 || v > f->hi)
				bad_field(expr, f, psprintf("the step %ld is out of range 1-%d", v, f->hi));
			step = (int) v;
			/* "a/step": from a to the end, as cronie reads it */
			if (single)
				b = f->hi;
			p = s;
		}
		for (int v = a; v <= b; v += step)
			bits |= UINT64CONST(1) << v;
		if (*p == '\0')
			break;
		if (*p != ',')
			bad_field(expr, f, psprintf("unexpected \"%s\"", p));
		p++;
	}
	return bits;
}

static void
parse_every(const char *expr, const char *arg, PgjqCron *cron)
{
	char	   *end;
	long		n;
	int64		unit;

	while (*arg == ' ')
		arg++;
	n = strtol(arg, &end, 10);
	if (end == arg || n < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cron expression \"%s\"", expr),
				 errdetail("@every takes a positive whole number and a unit, as in \"@every 10 seconds\".")));
	while (*end == ' ')
		end++;
	if (pg_strcasecmp(end, "second") == 0 || pg_strcasecmp(end, "seconds") == 0)
		unit = USECS_PER_SEC;
	else if (pg_strcasecmp(end, "minute") == 0 || pg_strcasecmp(end, "minutes") == 0)
		unit = USECS_PER_MINUTE;
	else if (pg_strcasecmp(end, "hour") == 0 || pg_strcasecmp(end, "hours") == 0)
		unit = USECS_PER_HOUR;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cron expression \"%s\"", expr),
				 errdetail("The unit of @every is seconds, minutes or hours, not \"%s\".", end)));
	if (n > 366 * USECS_PER_DAY / unit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cron expression \"%s\"", expr),
				 errdetail("@every takes at most 366 days.")));
	cron->every_us = n * unit;
}

void
pgjq_cron_parse(const char *expr, PgjqCron *cron)
{
	static const struct
	{
		const char *alias;
		const char *spec;
	}			aliases[] = {
		{"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
		{"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"}, {"@midnight", "0 0 * * *"},
		{"@hourly", "0 * * * *"},
	};
	const char *spec = expr;
	char	   *copy;
	char	   *part[5];
	int			nparts = 0;
	uint64		bits[5];

	memset(cron, 0, sizeof(*cron));
	while (*spec == ' ')
		spec++;
	if (*spec == '@')
	{
		if (pg_strncasecmp(spec, "@every ", 7) == 0)
		{
			parse_every(expr, spec + 7, cron);
			return;
		}
		for (int i = 0; i < lengthof(aliases); i++)
			if (pg_strcasecmp(spec, aliases[i].alias) == 0)
			{
				spec = aliases[i].spec;
				break;
			}
		if (*spec == '@')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid cron expression \"%s\"", expr),
					 errdetail("Known aliases: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every N seconds|minutes|hours.")));
	}
	copy = pstrdup(spec);
	for (char *p = copy; *p;)
	{
		while (*p == ' ' || *p == '\t')
			*p++ = '\0';
		if (*p == '\0')
			break;
		if (nparts < 5)
			part[nparts] = p;
		nparts++;
		while (*p && *p != ' ' && *p != '\t')
			p++;
	}
	if (nparts != 5)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cron expression \"%s\"", expr),
				 errdetail("A cron expression has 5 fields (minute, hour, day of month, month, day of week), not %d.",
						   nparts)));
	for (int i = 0; i < 5; i++)
		bits[i] = parse_field(expr, &fields[i], part[i]);
	cron->minutes = bits[0];
	cron->hours = (uint32) bits[1];
	cron->days = (uint32) bits[2];
	cron->months = (uint16) bits[3];
	/* 7 is Sunday as well as 0 */
	cron->weekdays = (uint8) ((bits[4] | (bits[4] >> 7)) & 0x7F);
	cron->days_star = part[2][0] == '*';
	cron->weekdays_star = part[4][0] == '*';
	pfree(copy);
}

pg_tz *
pgjq_cron_zone(const char *name, const char *argname)
{
	pg_tz	   *tz = pg_tzset(name);

	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s \"%s\" is not a known time zone", argname, name),
				 errhint("Use a name from pg_timezone_names, such as 'UTC' or 'Europe/Berlin'.")));
	return tz;
}

/* Microseconds from the Unix epoch to PostgreSQL's. */
#define EPOCH_SHIFT_US	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY)

static int64
floor_div(int64 a, int64 b)
{
	int64		q = a / b;

	return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static struct pg_tm *
local_at(TimestampTz t, pg_tz *tz)
{
	pg_time_t	tt = (pg_time_t) floor_div(t + EPOCH_SHIFT_US, USECS_PER_SEC);

	return pg_localtime(&tt, tz);
}

static bool
day_matches(const PgjqCron *c, const struct pg_tm *tm)
{
	bool		dom = (c->days >> tm->tm_mday) & 1;
	bool		dow = (c->weekdays >> tm->tm_wday) & 1;

	if (c->days_star && c->weekdays_star)
		return true;
	if (c->days_star)
		return dow;
	if (c->weekdays_star)
		return dom;
	return dom || dow;
}

TimestampTz
pgjq_cron_next(const PgjqCron *c, pg_tz *tz, TimestampTz after)
{
	TimestampTz t;
	TimestampTz limit;

	if (c->every_us > 0)
	{
		int64		u = after + EPOCH_SHIFT_US;

		return (floor_div(u, c->every_us) + 1) * c->every_us - EPOCH_SHIFT_US;
	}
	t = (floor_div(after, USECS_PER_MINUTE) + 1) * USECS_PER_MINUTE;
	limit = after + 5 * 366 * USECS_PER_DAY;
	while (t <= limit)
	{
		struct pg_tm tm = *local_at(t, tz);
		int			next_min = -1;

		if (!((c->months >> (tm.tm_mon + 1)) & 1) || !day_matches(c, &tm) ||
			!((c->hours >> tm.tm_hour) & 1))
		{
			/* nothing in this local hour */
			t += (60 - tm.tm_min) * USECS_PER_MINUTE;
			continue;
		}
		for (int m = tm.tm_min; m < 60; m++)
			if ((c->minutes >> m) & 1)
			{
				next_min = m;
				break;
			}
		if (next_min < 0)
		{
			t += (60 - tm.tm_min) * USECS_PER_MINUTE;
			continue;
		}
		if (next_min > tm.tm_min)
		{
			t += (next_min - tm.tm_min) * USECS_PER_MINUTE;
			continue;			/* look again: an offset change may lie
								 * between */
		}

		/*
		 * A match.  If the offset from UTC dropped in the last three hours (a
		 * fall-back), and the wall time one drop ago was this same one, this
		 * is its second occurrence: it fired the first time.
		 */
		{
			struct pg_tm before = *local_at(t - 3 * USECS_PER_HOUR, tz);

			if (before.tm_gmtoff > tm.tm_gmtoff)
			{
				struct pg_tm first = *local_at(t - (before.tm_gmtoff - tm.tm_gmtoff) * USECS_PER_SEC, tz);

				if (first.tm_year == tm.tm_year && first.tm_yday == tm.tm_yday &&
					first.tm_hour == tm.tm_hour && first.tm_min == tm.tm_min)
				{
					t += USECS_PER_MINUTE;
					continue;
				}
			}
		}
		return t;
	}
	return DT_NOEND;
}
