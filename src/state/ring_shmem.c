/*-------------------------------------------------------------------------
 *
 * ring_shmem.c
 *	  The ring engine's shared memory: its allocation (the shared struct
 *	  with the node pool and the per-database records, and the hash tables
 *	  of the in-flight entries, lanes, queues, priorities, held keys and
 *	  key_rate buckets) and the buckets' lookups that a lane's settling asks.
 *	  ring_records.c keeps the records, ring_xact.c what a transaction notes
 *	  and its commit and abort callbacks.
 *
 * Order: pgjq_ring_shmem_size when _PG_init requests shared memory, then
 * pgjq_ring_shmem_init from the startup hook; every other ring file only
 * runs once `ring` is set (pgjq_ring_require says so to SQL callers).
 *
 * Bounds (settings, all PGC_POSTMASTER): pgjq.ring_positions nodes (ready
 * jobs plus those being enqueued or claimed), pgjq.ring_max_in_flight
 * running jobs, pgjq.ring_max_lanes lanes (and as many priority rings),
 * pgjq.ring_max_queues queues with ready or running ring jobs,
 * pgjq.max_databases databases.  Every table has a fixed size: a full
 * one refuses the call that needs an entry (ring_records.c).
 *
 * Locking: see ring_internal.h (ring->lock, tranche "pgjq" number 4).
 *
 *-------------------------------------------------------------------------
 */
#include "state/ring_internal.h"

#include "common/guc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

RingShared *ring = NULL;
HTAB	   *ring_flights = NULL;
HTAB	   *ring_lanes = NULL;
HTAB	   *ring_queues = NULL;
HTAB	   *ring_prios = NULL;
HTAB	   *ring_holds = NULL;

static Size
nodes_size(void)
{
	return MAXALIGN(add_size(offsetof(RingShared, nodes),
							 mul_size(pgjq_ring_positions, sizeof(RingNode))));
}

static Size
struct_size(void)
{
	return add_size(nodes_size(), mul_size(pgjq_max_databases, sizeof(RingDb)));
}

Size
pgjq_ring_shmem_size(void)
{
	Size		s = struct_size();

	s = add_size(s, hash_estimate_size(pgjq_ring_max_in_flight, sizeof(RingFlight)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_lanes, sizeof(RingLane)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_queues, sizeof(RingQueue)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_lanes, sizeof(RingPrio)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_holds, sizeof(RingHold)));
	s = add_size(s, ring_rates_shmem_size());
	return s;
}

/*
 * The key_rate buckets (key_rate.c takes from them and settles the lanes):
 * their table and the heap of their wake-ups are here with the rest of the
 * ring's shared memory, since a lane asks them whether it is held back.
 */
HTAB	   *ring_rates = NULL;
RingRateHeap *ring_rate_heap = NULL;

Size
ring_rates_shmem_size(void)
{
	Size		s = hash_estimate_size(pgjq_ring_max_rate_keys, sizeof(RingRate));

	return add_size(s, add_size(offsetof(RingRateHeap, w),
								mul_size(pgjq_ring_max_rate_keys, sizeof(RingRateWake))));
}

void
ring_rates_shmem_init(void)
{
	HASHCTL		info;
	bool		found;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingHoldKey);
	info.entrysize = sizeof(RingRate);
	ring_rates = ShmemInitHash("pgjq ring key rates", pgjq_ring_max_rate_keys,
							   pgjq_ring_max_rate_keys, &info,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ring_rate_heap = ShmemInitStruct("pgjq ring key rate wake-ups",
									 add_size(offsetof(RingRateHeap, w),
											  mul_size(pgjq_ring_max_rate_keys, sizeof(RingRateWake))),
									 &found);
	if (!found)
	{
		ring_rate_heap->throttled = 0;
		ring_rate_heap->n = 0;
	}
}

bool
ring_rates_any(void)
{
	return ring_rate_heap != NULL && ring_rate_heap->throttled > 0;
}

bool
ring_rate_throttled(const RingLaneKey *lk, TimestampTz now)
{
	RingHoldKey k;
	RingRate   *r;

	if (ring_rate_heap == NULL || ring_rate_heap->throttled == 0)
		return false;
	memset(&k, 0, sizeof(k));
	k.dbid = lk->dbid;
	k.queue_id = lk->queue_id;
	k.keyhash = lk->keyhash;
	r = hash_search(ring_rates, &k, HASH_FIND, NULL);
	return r != NULL && r->throttled_until > now;
}

void
ring_rates_clear(Oid dbid, int32 queue_id)
{
	HASH_SEQ_STATUS hs;
	RingRate   *r;

	if (ring_rates == NULL)
		return;
	hash_seq_init(&hs, ring_rates);
	while ((r = hash_seq_search(&hs)) != NULL)
		if (r->key.dbid == dbid && (queue_id == 0 || r->key.queue_id == queue_id))
		{
			if (r->throttled_until != 0)
			{
				r->throttled_until = 0;
				ring_rate_heap->throttled--;
			}
			hash_search(ring_rates, &r->key, HASH_REMOVE, NULL);
		}
}

/*
 * The in-flight table's hash: the id itself (mixed with the database in the
 * high bits), not tag_hash.  Ids come from a sequence and a claim takes
 * neighbours, so its jobs land in neighbouring buckets: the ten entries of
 * a claim(10) share a cache line or two of the bucket array instead of
 * missing the cache (and, in a new backend, faulting a page in) once each.
 * perf on a D1 drain: with tag_hash's random buckets ring_flight_enter was
 * 3.9% of all backend CPU, mostly the bucket load, under the ring's
 * exclusive lock (docs/benchmarks.md, "The in-flight table's hash").
 */
static uint32
flight_hash(const void *key, Size keysize)
{
	const RingFlightKey *k = (const RingFlightKey *) key;
	uint64		h = (uint64) k->id + (uint64) k->dbid * UINT64CONST(0x9E3779B97F4A7C15);

	return (uint32) (h ^ (h >> 32));
}

/* Called by shmem.c's startup hook, holding AddinShmemInitLock. */
void
pgjq_ring_shmem_init(bool found_unused)
{
	bool		found;
	HASHCTL		info;

	ring = ShmemInitStruct("pgjq ring", struct_size(), &found);
	if (!found)
	{
		memset(ring, 0, offsetof(RingShared, nodes));
		ring->lock = &(GetNamedLWLockTranche("pgjq"))[4].lock;
		for (int i = 0; i < pgjq_ring_positions; i++)
			ring->nodes[i].p.id = 0;
		for (int i = 0; i < pgjq_ring_positions; i++)
			ring->nodes[i].next = (i + 1 < pgjq_ring_positions) ? i + 1 : -1;
		ring->free_head = pgjq_ring_positions > 0 ? 0 : -1;
		ring->ndbs = pgjq_max_databases;
		ring->dbs = (RingDb *) ((char *) ring + nodes_size());
		memset(ring->dbs, 0, sizeof(RingDb) * ring->ndbs);
	}
	/* hard bounds: a full table refuses the call that needs an entry */
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingFlightKey);
	info.entrysize = sizeof(RingFlight);
	info.hash = flight_hash;
	ring_flights = ShmemInitHash("pgjq ring in-flight", pgjq_ring_max_in_flight,
								 pgjq_ring_max_in_flight, &info,
								 HASH_ELEM | HASH_FUNCTION | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingLaneKey);
	info.entrysize = sizeof(RingLane);
	ring_lanes = ShmemInitHash("pgjq ring lanes", pgjq_ring_max_lanes, pgjq_ring_max_lanes,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingQueueKey);
	info.entrysize = sizeof(RingQueue);
	ring_queues = ShmemInitHash("pgjq ring queues", pgjq_ring_max_queues, pgjq_ring_max_queues,
								&info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	/* a priority exists only with a lane of it: never more than lanes */
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingPrioKey);
	info.entrysize = sizeof(RingPrio);
	ring_prios = ShmemInitHash("pgjq ring priorities", pgjq_ring_max_lanes, pgjq_ring_max_lanes,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingHoldKey);
	info.entrysize = sizeof(RingHold);
	ring_holds = ShmemInitHash("pgjq ring held keys", pgjq_ring_max_holds, pgjq_ring_max_holds,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ring_rates_shmem_init();
}

void
pgjq_ring_require(void)
{
	if (ring == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the ring engine needs pgjq in shared_preload_libraries"),
				 errhint("Add pgjq to shared_preload_libraries and restart the server.")));
}
