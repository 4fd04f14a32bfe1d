/*-------------------------------------------------------------------------
 *
 * storage_verify.c
 *	  The storage engine's durable invariants, for verify() (verify.c).
 *
 * One read-only query; each row is a disagreement (area, object, what was
 * expected, what was found).  The ring's checks against shared memory are
 * ring_verify.c's (pgjq_ring_verify).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/engine.h"
#include "engine/storage_internal.h"
#include "common/spi_plans.h"

#include "utils/builtins.h"

static PgjqPlan plan_verify = {
	/* a dedup anchor holds a key (the ring's side: ring_verify.c) */
	"SELECT 'jobs', 'job ' || j.id, 'a dedup anchor with a dedup_key', 'an anchor without one'"
	"  FROM pgjq.job j WHERE j.state = 'n' AND j.dedup_key IS NULL"
	/* every job's queue exists */
	" UNION ALL"
	" SELECT 'jobs', 'job ' || j.id, 'its queue', 'queue_id ' || j.queue_id || ' does not exist'"
	"  FROM pgjq.job j WHERE NOT EXISTS (SELECT FROM pgjq.queue q WHERE q.queue_id = j.queue_id)"
	/* no job is both unfinished and finished */
	" UNION ALL"
	" SELECT 'jobs', 'job ' || j.id, 'unfinished or dead/cancelled', 'both'"
	"  FROM pgjq.job j JOIN pgjq.job_history h ON h.id = j.id"
	" UNION ALL"
	" SELECT 'jobs', 'job ' || j.id, 'unfinished or completed', 'both'"
	"  FROM (SELECT unnest(d.ids) AS id FROM pgjq.job_done d) d JOIN pgjq.job j ON j.id = d.id"
	/* the sequences are above every id and token in use */
	" UNION ALL"
	" SELECT 'sequences', 'pgjq.job_id_seq', 'at least ' || m, s.last_value::text"
	"  FROM (SELECT greatest((SELECT max(id) FROM pgjq.job), (SELECT max(id) FROM pgjq.job_history),"
	"                        (SELECT max(max_id) FROM pgjq.job_done),"
	"                        (SELECT max(id) FROM pgjq.ring_body_0),"
	"                        (SELECT max(id) FROM pgjq.ring_body_1),"
	"                        (SELECT max(id) FROM pgjq.ring_body_2),"
	"                        (SELECT max(id) FROM pgjq.ring_body_3)) AS m) x,"
	"       pgjq.job_id_seq s WHERE x.m > s.last_value"
	" UNION ALL"
	" SELECT 'sequences', 'pgjq.token_seq', 'at least ' || m, s.last_value::text"
	"  FROM (SELECT greatest((SELECT max(token) FROM pgjq.job),"
	"                        (SELECT max(token) FROM pgjq.job_history),"
	"                        (SELECT max(token) FROM pgjq.ring_log_0),"
	"                        (SELECT max(token) FROM pgjq.ring_log_1),"
	"                        (SELECT max(token) FROM pgjq.ring_log_2),"
	"                        (SELECT max(token) FROM pgjq.ring_log_3)) AS m) x,"
	"       pgjq.token_seq s WHERE x.m > s.last_value"
	/* the history partitions and their registry agree */
	" UNION ALL"
	" SELECT 'history', p.relname::text, 'a partition of pgjq.' || p.parent, 'missing'"
	"  FROM pgjq.history_partition p"
	" WHERE NOT EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
	"                    WHERE c.relname = p.relname AND c.relnamespace = 'pgjq'::regnamespace"
	"                      AND i.inhparent = ('pgjq.' || p.parent)::regclass)"
	" UNION ALL"
	" SELECT 'history', c.relname::text, 'registered in pgjq.history_partition', 'not registered'"
	"  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
	" WHERE i.inhparent IN ('pgjq.job_done'::regclass, 'pgjq.job_history'::regclass)"
	"   AND NOT EXISTS (SELECT FROM pgjq.history_partition p WHERE p.relname = c.relname)",
	0, {InvalidOid}
};

/*
 * The durable invariants that do not hold, as rows in *rows (palloc'd in the
 * context current at pgjq_storage_begin); returns how many.
 */
int
pgjq_storage_verify(PgjqVerifyRow **rows)
{
	int			n;
	MemoryContext spi_cxt;

	pgjq_spi_run(&plan_verify, NULL, NULL, 0);
	n = (int) SPI_processed;
	spi_cxt = MemoryContextSwitchTo(pgjq_result_cxt);
	*rows = palloc(sizeof(PgjqVerifyRow) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		(*rows)[i].area = TextDatumGetCString(pgjq_spi_get(i, 1, &isnull));
		(*rows)[i].object = TextDatumGetCString(pgjq_spi_get(i, 2, &isnull));
		(*rows)[i].expected = TextDatumGetCString(pgjq_spi_get(i, 3, &isnull));
		(*rows)[i].found = TextDatumGetCString(pgjq_spi_get(i, 4, &isnull));
	}
	MemoryContextSwitchTo(spi_cxt);
	return n;
}
