/*
 * pgjq 0.4.0 -> 0.4.1: nothing lost in a move (issue 35, the review of
 * 0.4.0).  The Citus mode's move and guard are rebuilt; nothing changes for
 * a single server's jobs or calls.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.4.1'" to load this file. \quit

/*
 * First: the extension's lock, so that the background worker steps aside
 * until this update commits (issue 35, finding 6: DDL and the worker took
 * pgjq's tables in different orders and deadlocked).  Every later update
 * script begins with SELECT pgjq._exclude_worker().
 */
/*
 * Internal: the first statement of every update script (from 0.4.1 on): the
 * extension's lock, so that the background worker steps aside until the
 * update commits (src/worker/bgworker.c).  Superuser only.
 */
CREATE FUNCTION pgjq._exclude_worker()
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_exclude_worker';
REVOKE ALL ON FUNCTION pgjq._exclude_worker() FROM PUBLIC;
SELECT pgjq._exclude_worker();

/* ---- the Citus mode's move: nothing lost, the queue carried whole (issue 35) ---- */

CREATE FUNCTION pgjq._citus_lock_shard(shard bigint)
RETURNS integer
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_lock_shard';

CREATE FUNCTION pgjq._citus_history_ensure(finished_at timestamptz)
RETURNS void
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_history_ensure';

/*
 * Everything live in this node's queues of a routing shard, counted under
 * the shard's queue-name locks and the promotion lock (_citus_lock_shard,
 * held to the caller's transaction's end): rows of pgjq.job (scheduled,
 * ready, waiting, dedup anchors) and the ring's ready and running jobs.
 * The count is a statement after the locks: its snapshot sees every call
 * that held them committed, and every promotion published.
 */
CREATE FUNCTION pgjq._citus_shard_live(shard bigint)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r jsonb;
BEGIN
	PERFORM pgjq._citus_lock_shard(shard);
	SELECT jsonb_build_object('live', coalesce(sum(x.jobs + x.ready + x.running), 0),
							  'jobs', coalesce(sum(x.jobs), 0), 'ready', coalesce(sum(x.ready), 0),
							  'running', coalesce(sum(x.running), 0),
							  'detail', coalesce(string_agg(format('queue %s: %s rows of pgjq.job, %s ready and %s running in the ring',
																   quote_ident(x.name), x.jobs, x.ready, x.running), '; ' ORDER BY x.name)
												 FILTER (WHERE x.jobs + x.ready + x.running > 0), ''))
	  INTO r
	  FROM (SELECT q.name,
				   (SELECT count(*) FROM pgjq.job j WHERE j.queue_id = q.queue_id) AS jobs,
				   coalesce(c.ready, 0) AS ready, coalesce(c.running, 0) AS running
			  FROM pgjq.queue q
			  LEFT JOIN pgjq._ring_counts() c ON c.queue_id = q.queue_id
			 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, q.name) = shard) x;
	RETURN r;
END
$$;

/*
 * What this node's queues of a routing shard keep besides jobs, to carry
 * (step 4): dead jobs, dedup_for periods and key holds still in force.
 * Completed and cancelled jobs' history stays behind.
 */
CREATE FUNCTION pgjq._citus_shard_state(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	WITH q AS (SELECT queue_id, name FROM pgjq.queue
				WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, name) = $1)
	SELECT jsonb_build_object(
		'queues', (SELECT coalesce(jsonb_agg(q.name ORDER BY q.name), '[]') FROM q),
		'dead', (SELECT coalesce(jsonb_agg(to_jsonb(h) - 'queue_id' || jsonb_build_object('queue', q.name) ORDER BY h.id), '[]')
				   FROM pgjq.job_history h JOIN q ON q.queue_id = h.queue_id WHERE h.state = 'd'),
		'dedup', (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', q.name, 'dedup_key', d.dedup_key,
															   'job_id', d.job_id, 'until', d.until) ORDER BY q.name, d.dedup_key), '[]')
					FROM pgjq.dedup_period d JOIN q ON q.queue_id = d.queue_id WHERE d.until > now()),
		'holds', (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', q.name, 'fair_key', k.fair_key,
															   'until', k.until) ORDER BY q.name, k.fair_key), '[]')
					FROM pgjq.key_holds k JOIN q ON q.queue_id = k.queue_id WHERE k.until > now()))
$$;

/* this node's schedules of a routing shard's queues, with their slots (step 6) */
CREATE FUNCTION pgjq._citus_shard_schedules(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.name), '[]')
	  FROM pgjq.schedules s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = $1
$$;

/*
 * The source's state (_citus_shard_state, carried) on the target's copies (step 4),
 * idempotently.  exact (before the switch, when the target does not serve
 * the queues yet): the copies end with exactly the source's dead jobs,
 * periods and holds.  Otherwise (finishing a move after its switch, the
 * target serving): only what the target has nowhere (a dead job whose id
 * it knows in any state is not brought back), and no period or hold of the
 * target's is replaced.  A carried dead job keeps its id and finish time;
 * its history partition is made where missing and counts its queue.
 */
CREATE FUNCTION pgjq._citus_adopt_state(carried jsonb, exact boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	r jsonb;
	h pgjq.job_history;
	qid integer;
	part name;
	nd integer := 0;
	np integer := 0;
	nk integer := 0;
BEGIN
	IF exact THEN
		DELETE FROM pgjq.job_history x USING pgjq.queue q
		 WHERE x.queue_id = q.queue_id AND x.state = 'd'
		   AND q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
		   AND x.id NOT IN (SELECT (e->>'id')::bigint FROM jsonb_array_elements(carried->'dead') e);
		DELETE FROM pgjq.dedup_period x USING pgjq.queue q
		 WHERE x.queue_id = q.queue_id AND q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
		   AND (q.name, x.dedup_key) NOT IN (SELECT e->>'queue', e->>'dedup_key' FROM jsonb_array_elements(carried->'dedup') e);
		PERFORM pgjq.release_key(q.name, nullif(k.fair_key, ''))
		   FROM pgjq.key_holds k JOIN pgjq.queue q ON q.queue_id = k.queue_id
		  WHERE q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
			AND (q.name, k.fair_key::text) NOT IN (SELECT e->>'queue', e->>'fair_key' FROM jsonb_array_elements(carried->'holds') e);
	END IF;
	FOR r IN SELECT jsonb_array_elements(carried->'dead') LOOP
		SELECT queue_id INTO qid FROM pgjq.queue WHERE name = r->>'queue';
		IF NOT FOUND THEN
			RAISE EXCEPTION 'queue "%" does not exist here to take its dead jobs', r->>'queue'
				USING ERRCODE = 'undefined_object';
		END IF;
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgjq.job_history x WHERE x.id = (r->>'id')::bigint)
			OR (NOT exact AND EXISTS (SELECT 1 FROM pgjq.job((r->>'id')::bigint)));
		h := jsonb_populate_record(NULL::pgjq.job_history, r || jsonb_build_object('queue_id', qid));
		PERFORM pgjq._citus_history_ensure(h.finished_at);
		INSERT INTO pgjq.job_history SELECT h.*;
		/* a closed partition lists its queues for prune(): this one too */
		SELECT c.relname INTO part FROM pgjq.job_history x JOIN pg_class c ON c.oid = x.tableoid WHERE x.id = h.id;
		UPDATE pgjq.history_partition p SET queue_ids = p.queue_ids || qid
		 WHERE p.relname = part AND p.queue_ids IS NOT NULL AND NOT (qid = ANY (p.queue_ids));
		nd := nd + 1;
	END LOOP;
	FOR r IN SELECT jsonb_array_elements(carried->'dedup') LOOP
		INSERT INTO pgjq.dedup_period (queue_id, dedup_key, job_id, until)
		SELECT q.queue_id, r->>'dedup_key', (r->>'job_id')::bigint, (r->>'until')::timestamptz
		  FROM pgjq.queue q WHERE q.name = r->>'queue'
		ON CONFLICT (queue_id, dedup_key) DO UPDATE SET job_id = excluded.job_id, until = excluded.until
		 WHERE exact;
		np := np + 1;
	END LOOP;
	FOR r IN SELECT jsonb_array_elements(carried->'holds') LOOP
		CONTINUE WHEN NOT exact AND EXISTS (SELECT 1 FROM pgjq.key_holds k JOIN pgjq.queue q ON q.queue_id = k.queue_id
											 WHERE q.name = r->>'queue' AND k.fair_key = r->>'fair_key');
		PERFORM pgjq.hold_key(r->>'queue', nullif(r->>'fair_key', ''), (r->>'until')::timestamptz);
		nk := nk + 1;
	END LOOP;
	RETURN format('%s dead jobs, %s dedup periods, %s key holds', nd, np, nk);
END
$$;

/*
 * The source's schedules on the target (step 6, the target serving the
 * queues): a schedule the target has already is kept as it is (it may have
 * fired since); one of that name for another queue stops the move.
 */
CREATE FUNCTION pgjq._citus_adopt_schedules(schedules jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r jsonb;
	other text;
	n integer := 0;
BEGIN
	FOR r IN SELECT jsonb_array_elements(schedules) LOOP
		INSERT INTO pgjq.schedules (name, cron, queue, payload, time_zone, catch_up, next_slot, last_slot, created_at)
		SELECT s.name, s.cron, s.queue, s.payload, s.time_zone, s.catch_up, s.next_slot, s.last_slot, s.created_at
		  FROM jsonb_populate_record(NULL::pgjq.schedules, r) s
		ON CONFLICT (name) DO NOTHING;
		SELECT queue INTO other FROM pgjq.schedules WHERE name = r->>'name';
		IF other IS DISTINCT FROM r->>'queue' THEN
			RAISE EXCEPTION 'a schedule named "%" for queue "%" exists here already', r->>'name', other
				USING ERRCODE = 'duplicate_object',
					  HINT = 'unschedule() one of them, then call move_queues() again to finish the move.';
		END IF;
		n := n + 1;
	END LOOP;
	RETURN n;
END
$$;

/*
 * A move cut short after its switch, finished: the fenced node's state and
 * schedules to the node that holds the shard now (only what it has
 * nowhere: step 4 may not have run if the shard was moved outside
 * move_queues; a key hold released there since step 4 comes back until its
 * end), then its queues dropped (only if empty) and its fence.
 */
CREATE FUNCTION pgjq._citus_finish_on(shard bigint, from_host text, from_port integer, to_host text, to_port integer)
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM pgjq._citus_on(to_host, to_port, format('SELECT pgjq._citus_adopt_state(%L, false)',
		pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_shard_state(%s)', shard))));
	PERFORM pgjq._citus_on(to_host, to_port, format('SELECT pgjq._citus_adopt_schedules(%L)',
		pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_shard_schedules(%s)', shard))));
	PERFORM pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_release_queues(%s)', shard));
END
$$;

/*
 * Run on every node by citus_setup(): this node's ids and tokens start at
 * (group + 1) << 48, so an id names the node that issued it (and ids never
 * repeat across nodes); each node's range ends before the next one's.  A
 * group past the last range, or a sequence already past this node's range
 * (a dump of another node restored here), is refused.
 */
CREATE OR REPLACE FUNCTION pgjq._citus_node_setup()
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g integer := (SELECT groupid FROM pg_catalog.pg_dist_local_group);
	lo bigint;
	hi bigint;
BEGIN
	IF g < 0 OR g >= 32767 THEN
		RAISE EXCEPTION 'group % has no id range: pgjq gives ranges to groups 0 to 32766', g
			USING ERRCODE = 'program_limit_exceeded';
	END IF;
	lo := (g::bigint + 1) << 48;
	hi := lo + ((1::bigint << 48) - 1);
	IF (SELECT last_value FROM pgjq.job_id_seq) > hi OR (SELECT last_value FROM pgjq.token_seq) > hi THEN
		RAISE EXCEPTION 'the id sequences of group % are past its range (% to %)', g, lo, hi
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = pg_catalog.format('job_id_seq is at %s, token_seq at %s: ids of another node were restored here?',
											 (SELECT last_value FROM pgjq.job_id_seq), (SELECT last_value FROM pgjq.token_seq)),
				  HINT = 'Restore a node''s dump only into a node of the same group, or move its jobs off and set the sequences back by hand.';
	END IF;
	IF (SELECT last_value FROM pgjq.job_id_seq) < lo THEN
		PERFORM pg_catalog.setval('pgjq.job_id_seq', lo, false);
	END IF;
	IF (SELECT last_value FROM pgjq.token_seq) < lo THEN
		PERFORM pg_catalog.setval('pgjq.token_seq', lo, false);
	END IF;
	EXECUTE pg_catalog.format('ALTER SEQUENCE pgjq.job_id_seq MAXVALUE %s', hi);
	EXECUTE pg_catalog.format('ALTER SEQUENCE pgjq.token_seq MAXVALUE %s', hi);
	RETURN pg_catalog.format('group %s: ids from %s', g, lo);
END
$$;

CREATE OR REPLACE FUNCTION pgjq.citus_setup(shard_count integer DEFAULT 32)
RETURNS TABLE (node_name text, node_port integer, group_id integer, result text)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f regprocedure;
	n record;
	strat record;
	r record;
BEGIN
	IF NOT coalesce((SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.rolname = current_user), false) THEN
		RAISE EXCEPTION 'citus_setup() is for a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'It distributes a table and functions with Citus and sets every node''s id range.';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
		RAISE EXCEPTION 'citus_setup() needs the citus extension in this database'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Preload citus on every node (shared_preload_libraries = ''citus,pgjq''), then CREATE EXTENSION citus.';
	END IF;
	IF (SELECT groupid FROM pg_catalog.pg_dist_local_group) <> 0 THEN
		RAISE EXCEPTION 'citus_setup() runs on the coordinator'
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF shard_count IS NULL OR shard_count < 1 OR shard_count > 64000 THEN
		RAISE EXCEPTION 'shard_count must be between 1 and 64000'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT d.nodename, d.nodeport INTO n FROM pg_catalog.pg_dist_node d
	 WHERE d.isactive AND d.noderole = 'primary' AND d.groupid <> 0
	   AND NOT (d.hasmetadata AND d.metadatasynced)
	 ORDER BY d.nodeid LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'metadata sync is off for node %:%', n.nodename, n.nodeport
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'pgjq routes calls with Citus''s function delegation, which needs every node''s metadata.',
				  HINT = pg_catalog.format('SELECT citus_activate_node(%L, %s);', n.nodename, n.nodeport);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node d WHERE d.isactive AND d.noderole = 'primary' AND d.groupid <> 0) THEN
		RAISE EXCEPTION 'the cluster has no worker node'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Add one with citus_add_node(host, port).';
	END IF;

	IF pg_catalog.to_regclass('pgjq.queue_route') IS NULL THEN
		CREATE TABLE pgjq.queue_route (queue text PRIMARY KEY);
		COMMENT ON TABLE pgjq.queue_route IS 'Citus mode: the shard a queue name hashes to decides the node that serves it (no rows needed)';
		PERFORM pg_catalog.create_distributed_table('pgjq.queue_route', 'queue',
													shard_count := shard_count, colocate_with := 'none');
	END IF;

	/* every function whose first argument is the queue */
	FOR f IN
		SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
		 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.prokind = 'f'
		   AND p.pronargs > 0 AND p.proargtypes[0] = 'text'::regtype
		   AND p.proname IN ('create_queue', 'alter_queue', 'drop_queue', 'pause', 'resume', 'purge',
							 'retry_dead', 'enqueue', 'enqueue_many', 'claim', 'complete_and_claim',
							 'hold_key', 'release_key', 'cancel_key', 'complete_in', 'fail_in',
							 'heartbeat_in', 'snooze_in', 'cancel_in', 'job_in')
		 ORDER BY 1::text
	LOOP
		PERFORM pg_catalog.create_distributed_function(f, '$1', colocate_with := 'pgjq.queue_route',
													   force_delegation := true);
	END LOOP;

	/* the default strategy as it is, but routing shards stay put */
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_rebalance_strategy WHERE name = 'pgjq_keeps_queues') THEN
		SELECT * INTO strat FROM pg_catalog.pg_dist_rebalance_strategy WHERE default_strategy;
		PERFORM pg_catalog.citus_add_rebalance_strategy('pgjq_keeps_queues', strat.shard_cost_function,
			strat.node_capacity_function, 'pgjq.routing_shard_allowed_on_node', strat.default_threshold,
			strat.minimum_threshold, strat.improvement_threshold);
		PERFORM pg_catalog.citus_set_default_rebalance_strategy('pgjq_keeps_queues');
	END IF;

	/* every node's id range: a node that fails stops the setup, named */
	FOR r IN
		SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp, x.success, x.result
		  FROM pg_catalog.run_command_on_all_nodes('SELECT pgjq._citus_node_setup()') x
		  JOIN pg_catalog.pg_dist_node d ON d.nodeid = x.nodeid
		 ORDER BY d.groupid
	LOOP
		IF NOT r.success THEN
			RAISE EXCEPTION 'node %:% (group %) could not be given its id range: %', r.host, r.port, r.grp, r.result
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  HINT = 'Fix that node, then run citus_setup() again (it is idempotent).';
		END IF;
		node_name := r.host;
		node_port := r.port;
		group_id := r.grp;
		result := r.result;
		RETURN NEXT;
	END LOOP;
END
$$;

/*
 * What this node's queues of a routing shard still hold (a look without
 * locks, for the drain's progress), and why a queue could never drain:
 * paused with jobs, or a key held in force while it has jobs.
 */
CREATE OR REPLACE FUNCTION pgjq._citus_shard_jobs(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT jsonb_build_object('unfinished', coalesce(sum(s.ready + s.scheduled + s.running + s.waiting), 0),
							  'dead', coalesce(sum(s.dead), 0), 'queues', count(*),
							  'schedules', (SELECT count(*) FROM pgjq.schedules p
											 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, p.queue) = $1),
							  'stuck', coalesce(jsonb_agg(
									CASE WHEN s.paused THEN format('queue %s is paused', quote_ident(s.queue))
										 ELSE format('queue %s has %s held keys', quote_ident(s.queue), s.held_keys) END
									ORDER BY s.queue)
								FILTER (WHERE s.ready + s.scheduled + s.waiting > 0 AND (s.paused OR s.held_keys > 0)), '[]'))
	  FROM pgjq.queue_stats s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = $1
$$;

/*
 * The target's copies of the queues (step 2; the guard is off: it does not
 * serve them yet): made, or brought to the source's settings and paused
 * state where a copy is left from an earlier move.
 */
CREATE OR REPLACE FUNCTION pgjq._citus_adopt_queues(queues jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	q jsonb;
	n integer := 0;
BEGIN
	FOR q IN SELECT jsonb_array_elements(queues) LOOP
		IF EXISTS (SELECT 1 FROM pgjq.queue WHERE name = q->>'name') THEN
			/* 0 removes a limit: alter_queue's NULL would keep a stale one */
			PERFORM pgjq.alter_queue(q->>'name', (q->>'lease')::interval, (q->>'max_attempts')::integer,
									 (q->>'backoff_base')::interval, (q->>'backoff_max')::interval,
									 (q->>'retention')::interval, coalesce((q->>'concurrency')::integer, 0),
									 coalesce((q->>'key_concurrency')::integer, 0),
									 coalesce((q->>'rate')::double precision, 0),
									 coalesce((q->>'burst')::integer, 0), coalesce((q->>'timeout')::interval, '0'),
									 coalesce((q->>'key_rate')::double precision, 0),
									 coalesce((q->>'key_burst')::integer, 0));
			IF (q->>'paused')::boolean IS DISTINCT FROM
			   (SELECT paused FROM pgjq.queue WHERE name = q->>'name') THEN
				IF (q->>'paused')::boolean THEN
					PERFORM pgjq.pause(q->>'name');
				ELSE
					PERFORM pgjq.resume(q->>'name');
				END IF;
			END IF;
			CONTINUE;
		END IF;
		PERFORM pgjq.create_queue(q->>'name', (q->>'lease')::interval, (q->>'max_attempts')::integer,
								  (q->>'backoff_base')::interval, (q->>'backoff_max')::interval,
								  (q->>'retention')::interval, (q->>'concurrency')::integer,
								  (q->>'key_concurrency')::integer, (q->>'rate')::double precision,
								  (q->>'burst')::integer, (q->>'timeout')::interval,
								  (q->>'key_rate')::double precision, (q->>'key_burst')::integer);
		IF (q->>'paused')::boolean THEN
			PERFORM pgjq.pause(q->>'name');
		END IF;
		n := n + 1;
	END LOOP;
	RETURN n;
END
$$;

/*
 * Drop this node's queues of a routing shard (their schedules and carried
 * dead jobs with them), then its fence; only when they hold nothing live,
 * counted under their locks (_citus_shard_live): else SQLSTATE 55006 and
 * nothing is dropped, the fence kept.  Run where the queues are copies or
 * have been carried: the source after the switch, a target given up, a
 * node left fenced by a move cut short.
 */
CREATE OR REPLACE FUNCTION pgjq._citus_release_queues(shard bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	live jsonb;
	q record;
	n integer := 0;
BEGIN
	live := pgjq._citus_shard_live(shard);
	IF (live->>'live')::bigint > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % still hold % live jobs here: nothing is dropped', shard, live->>'live'
			USING ERRCODE = 'object_in_use', DETAIL = live->>'detail',
				  HINT = 'The fence stays.  A move drops a node''s queues only once they are empty; see where these jobs came from (pgjq.route() names the node that serves the queue).';
	END IF;
	DELETE FROM pgjq.schedules s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = shard;
	FOR q IN SELECT queue_id, name FROM pgjq.queue
			  WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, name) = shard
			  ORDER BY name LOOP
		DELETE FROM pgjq.job_history h WHERE h.queue_id = q.queue_id AND h.state = 'd';
		PERFORM pgjq.drop_queue(q.name, false);
		n := n + 1;
	END LOOP;
	PERFORM pgjq._citus_unfence(shard);
	RETURN n;
END
$$;

/* run one statement on one node (its own connection and transaction) */
CREATE OR REPLACE FUNCTION pgjq._citus_on(node_name text, node_port integer, command text)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
BEGIN
	SELECT * INTO r FROM master_run_on_worker(ARRAY[node_name], ARRAY[node_port], ARRAY[command], false);
	IF NOT r.success THEN
		RAISE EXCEPTION 'on node %:%: %', node_name, node_port, r.result
			USING ERRCODE = CASE WHEN r.result LIKE '%nothing is dropped%' THEN 'object_in_use'
								 ELSE 'connection_exception' END;
	END IF;
	RETURN r.result;
END
$$;

CREATE OR REPLACE PROCEDURE pgjq.move_queues(shard bigint, node_name text, node_port integer,
								  drain_wait interval DEFAULT '1 minute')
LANGUAGE plpgsql
AS $$
DECLARE
	src record;
	tgt record;
	n record;
	qs jsonb;
	st jsonb;
	live jsonb;
	g integer;
	deadline timestamptz;
	fenced "char" := 'f';
	stop_after integer;
	lock_key integer;
	holder text;
BEGIN
	/*
	 * A procedure that commits cannot have a SET clause: the search_path is
	 * set for each of its transactions instead (COMMIT resets it).
	 */
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user), false) THEN
		RAISE EXCEPTION 'move_queues() is for a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'It runs pgjq''s steps on every node and moves Citus shards (citus_move_shard_placement).';
	END IF;
	IF to_regclass('pgjq.queue_route') IS NULL THEN
		RAISE EXCEPTION 'this database is not in pgjq''s Citus mode'
			USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Run SELECT pgjq.citus_setup() first.';
	END IF;
	IF (SELECT groupid FROM pg_dist_local_group) <> 0 THEN
		RAISE EXCEPTION 'move_queues() runs on the coordinator' USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF shard IS NULL OR NOT EXISTS (SELECT 1 FROM pg_dist_shard s WHERE s.shardid = shard
									 AND s.logicalrelid = 'pgjq.queue_route'::regclass) THEN
		RAISE EXCEPTION 'shard % is not a shard of pgjq.queue_route', shard
			USING ERRCODE = 'invalid_parameter_value', HINT = 'pgjq.route(queue) names the shard of a queue.';
	END IF;
	IF drain_wait IS NULL OR drain_wait < '0' THEN
		RAISE EXCEPTION 'drain_wait must not be negative' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp INTO tgt FROM pg_dist_node d
	 WHERE d.nodename = node_name AND d.nodeport = node_port AND d.noderole = 'primary' AND d.isactive;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no active primary node %:% in the cluster', node_name, node_port
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	stop_after := coalesce(nullif(current_setting('pgjq.debug_move_stop_after', true), ''), '0')::integer;

	/*
	 * One move of a shard at a time: a session lock on the coordinator,
	 * held across the procedure's commits.  This session may hold it
	 * already (an earlier call of it stopped by an error): it goes on.
	 */
	lock_key := (shard % 2147483647)::integer;
	IF NOT EXISTS (SELECT 1 FROM pg_locks l
					WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
					  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
					  AND l.classid::bigint = 1886022006 AND l.objid::bigint = lock_key AND l.objsubid = 2) THEN
		IF NOT pg_try_advisory_lock(1886022006, lock_key) THEN
			SELECT string_agg(l.pid::text, ', ') INTO holder FROM pg_locks l
			 WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = 1886022006
			   AND l.objid::bigint = lock_key AND l.objsubid = 2;
			RAISE EXCEPTION 'routing shard % is being moved by another move_queues() call', shard
				USING ERRCODE = 'object_in_use',
					  DETAIL = format('The session with process id %s on the coordinator holds the shard''s move lock.', holder),
					  HINT = 'Wait for that call to end (or end that session), then call move_queues() again.';
		END IF;
	END IF;

	SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp INTO src
	  FROM pg_dist_placement p JOIN pg_dist_node d ON d.groupid = p.groupid AND d.noderole = 'primary'
	 WHERE p.shardid = shard ORDER BY p.placementid LIMIT 1;

	/*
	 * Moves cut short: a fence on a node other than the one that holds the
	 * shard.  Toward that node: the move's switch was done, its last step
	 * not: finish it (carry what the fenced node keeps, drop its empty
	 * queues, lift the fence).  Toward any other: the shard went elsewhere
	 * behind pgjq's back; stop.
	 */
	FOR n IN SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp, r.success, r.result
			   FROM run_command_on_all_nodes(format('SELECT coalesce(string_agg(target_group::text, '',''), '''') FROM pgjq.queue_fence WHERE shard = %s', shard)) r
			   JOIN pg_dist_node d ON d.nodeid = r.nodeid
			  WHERE d.groupid <> src.grp ORDER BY d.groupid LOOP
		IF NOT n.success THEN
			RAISE EXCEPTION 'node %:% could not be reached to look for fences of routing shard %: %', n.host, n.port, shard, n.result
				USING ERRCODE = 'connection_exception';
		END IF;
		CONTINUE WHEN n.result = '';
		IF n.result::integer <> src.grp THEN
			RAISE EXCEPTION 'node %:% has a fence of routing shard % toward group %, but the shard is on group %', n.host, n.port, shard, n.result, src.grp
				USING ERRCODE = 'object_in_use',
					  DETAIL = 'A move of the shard was cut short and the shard was moved since, outside move_queues().',
					  HINT = 'Look at that node''s queues of the shard (pgjq._citus_shard_live) before you lift its fence by hand.';
		END IF;
		PERFORM pgjq._citus_finish_on(shard, n.host, n.port, src.host, src.port);
		RAISE NOTICE 'routing shard % was already on %:%; its queues on %:% are dropped now', shard, src.host, src.port, n.host, n.port;
	END LOOP;
	IF src.grp = tgt.grp THEN
		PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_unfence(%s)', shard));
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

	st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
	IF jsonb_array_length(st->'stuck') > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % cannot drain: %', shard,
				(SELECT string_agg(e, ', ') FROM jsonb_array_elements_text(st->'stuck') e)
			USING ERRCODE = 'object_in_use',
				  DETAIL = 'A move waits until the source''s queues hold no job; no claim takes the jobs of a paused queue or of a held key.',
				  HINT = 'resume() the queue or release_key() the keys (or wait until their jobs ran), then move the queues.';
	END IF;

	/* 1. fence the source */
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''f'')', shard, tgt.grp));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 1 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 1 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 2. the queues on the target */
	qs := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_queues(%s)', shard))::jsonb;
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_queues(%L)', qs));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 2 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 2 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/*
	 * 3. the source finishes what it holds; once it looks empty its claims
	 * are refused too ('s'), and the final check counts under the queues'
	 * and the promotion's locks: jobs it finds besides running ones (a
	 * promotion that had not published, a retry) lift 's' again and the
	 * drain goes on; running ones are waited for under 's'
	 */
	deadline := clock_timestamp() + drain_wait;
	LOOP
		IF fenced = 's' THEN
			live := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_live(%s)', shard))::jsonb;
			EXIT WHEN (live->>'live')::bigint = 0;
			IF (live->>'jobs')::bigint + (live->>'ready')::bigint > 0 THEN
				PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''f'')', shard, tgt.grp));
				fenced := 'f';
			END IF;
		ELSE
			st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
			IF (st->>'unfinished')::bigint = 0 THEN
				PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''s'')', shard, tgt.grp));
				fenced := 's';
				CONTINUE;
			END IF;
		END IF;
		IF clock_timestamp() >= deadline THEN
			/* never release queues on a node that holds the shard (moved behind pgjq's back) */
			SELECT p.groupid INTO g FROM pg_dist_placement p WHERE p.shardid = shard ORDER BY p.placementid LIMIT 1;
			IF g IS DISTINCT FROM src.grp THEN
				RAISE EXCEPTION 'routing shard % was moved to group % outside move_queues() while its queues on %:% were drained: nothing is dropped', shard, g, src.host, src.port
					USING ERRCODE = 'object_in_use',
						  DETAIL = 'The fence stays; the queues on both nodes keep their jobs.',
						  HINT = 'Once the queues on the old node are empty, call move_queues() toward the node that holds the shard to finish.';
			END IF;
			PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
			PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_unfence(%s)', shard));
			PERFORM pg_advisory_unlock(1886022006, lock_key);
			RAISE EXCEPTION 'the queues of routing shard % still hold % unfinished and % dead jobs after %: nothing moved',
					shard, coalesce(st->>'unfinished', live->>'live'), coalesce(st->>'dead', '0'), drain_wait
				USING ERRCODE = 'object_in_use',
					  DETAIL = 'Enqueues were refused with SQLSTATE PJ002 while the move waited; they are taken again.',
					  HINT = 'Delayed and waiting jobs keep a queue on its node until they run: try again later, or with a longer drain_wait.';
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 3 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 3 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 4. what the queues keep besides jobs (the source frozen under 's') */
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_state(%L, true)',
		pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_state(%s)', shard))));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 4 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 4 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 5. Citus moves the shard group; from its commit calls go to the target */
	PERFORM citus_move_shard_placement(shard, src.host, src.port, tgt.host, tgt.port,
									   shard_transfer_mode := 'block_writes');
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 5 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 5 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/*
	 * 6. the schedules to the target; the source's empty queues and its
	 * fence (the rest was carried at step 4: a hold released on the target
	 * since must not come back)
	 */
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_schedules(%L)',
		pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_schedules(%s)', shard))));
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_unfence(%s)', shard));
	PERFORM pg_advisory_unlock(1886022006, lock_key);
	RAISE NOTICE 'routing shard % moved from %:% to %:% with % queues', shard, src.host, src.port,
		tgt.host, tgt.port, jsonb_array_length(qs);
END
$$;

COMMENT ON PROCEDURE pgjq.move_queues(bigint, text, integer, interval) IS 'Citus mode: move the queues of a routing shard (and the application shards colocated with it) to another node, with their dead jobs, dedup_for periods, key holds and schedules: enqueues wait (SQLSTATE PJ002) while the source finishes what it holds; nothing moves if it does not within drain_wait; superuser, on the coordinator; calling it again finishes a move cut short';

REVOKE ALL ON FUNCTION pgjq._citus_lock_shard(bigint), pgjq._citus_history_ensure(timestamptz),
	pgjq._citus_shard_live(bigint), pgjq._citus_shard_state(bigint), pgjq._citus_shard_schedules(bigint),
	pgjq._citus_adopt_state(jsonb, boolean), pgjq._citus_adopt_schedules(jsonb),
	pgjq._citus_finish_on(bigint, text, integer, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq._citus_lock_shard(bigint), pgjq._citus_history_ensure(timestamptz),
	pgjq._citus_shard_live(bigint), pgjq._citus_shard_state(bigint), pgjq._citus_shard_schedules(bigint),
	pgjq._citus_adopt_state(jsonb, boolean), pgjq._citus_adopt_schedules(jsonb),
	pgjq._citus_finish_on(bigint, text, integer, text, integer) TO pgjq_admin;
