/*-------------------------------------------------------------------------
 *
 * key_rate.h
 *	  Per-key rate limits of ring claims (key_rate.c), as alter_queue sees
 *	  them; the claim's side is in ring_internal.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_KEY_RATE_H
#define PGJQ_KEY_RATE_H

#include "common/pgjq_common.h"

/* alter_queue changed key_rate or key_burst: its throttled keys come back */
extern void pgjq_ring_rates_altered(int32 queue_id);

#endif							/* PGJQ_KEY_RATE_H */
