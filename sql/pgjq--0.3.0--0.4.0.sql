/*
 * pgjq 0.3.0 -> 0.4.0: pgjq on a Citus cluster (README, "Beyond one server
 * (Citus)").  Adds the fence table, the queue-first forms, route(),
 * citus_setup() and move_queues(), and job(id)'s first branch (the guard of
 * an id another node issued).  Nothing changes for a single server.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.4.0'" to load this file. \quit

/*
 * Internal: under Citus, job(id)'s first branch: the wrong-node error for an
 * id another node issued (citus/ownership.c); no row otherwise.
 */
CREATE FUNCTION pgjq._job_guard(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS 'MODULE_PATHNAME', 'pgjq_job_guard';

CREATE OR REPLACE FUNCTION pgjq.job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
	SELECT * FROM pgjq._job_guard($1)
	UNION ALL
	SELECT j.id, q.name,
		   CASE j.state WHEN 's' THEN 'scheduled' WHEN 'w' THEN 'waiting' ELSE 'ready' END,
		   j.attempt, j.max_attempts, j.priority, NULLIF(j.fair_key, ''), j.dedup_key,
		   j.payload, j.enqueued_at, j.run_at, j.lease_until, NULL::timestamptz,
		   j.worker, j.last_error, j.cancel_requested, NULL::jsonb,
		   CASE WHEN j.state OPERATOR(pg_catalog.=) 'w' THEN
				ARRAY(SELECT d.depends_on FROM pgjq.job_dependency d
					   WHERE d.job_id OPERATOR(pg_catalog.=) j.id ORDER BY 1) END
	  FROM pgjq.job j LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) j.queue_id
	 WHERE j.id OPERATOR(pg_catalog.=) $1 AND j.state OPERATOR(pg_catalog.<>) 'n'
	UNION ALL
	SELECT h.id, q.name,
		   CASE h.state WHEN 'd' THEN 'dead' ELSE 'cancelled' END,
		   h.attempt, h.max_attempts, h.priority, NULLIF(h.fair_key, ''), h.dedup_key,
		   h.payload, h.enqueued_at, NULL, NULL, h.finished_at,
		   h.worker, h.last_error, false, NULL, NULL
	  FROM pgjq.job_history h LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) h.queue_id
	 WHERE h.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT u.id, q.name, 'completed', u.attempt, NULL, NULL, NULL, NULL,
		   NULL, u.enqueued_at, NULL, NULL, d.finished_at,
		   NULL, NULL, false, u.result, NULL
	  FROM pgjq.job_done d
	 CROSS JOIN LATERAL unnest(d.ids, d.attempts, d.enqueued_at, d.results)
			 AS u(id, attempt, enqueued_at, result)
	  LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) d.queue_id
	 WHERE d.min_id OPERATOR(pg_catalog.<=) $1 AND d.max_id OPERATOR(pg_catalog.>=) $1
	   AND u.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT * FROM pgjq._ring_job($1)
	 LIMIT 1
$$;

/* ------------------------------------------------------- beyond one server */

/*
 * pgjq on a Citus cluster (README, "Beyond one server (Citus)").  Every
 * node keeps its own pgjq (tables, ring, worker); pgjq.citus_setup() makes
 * one small distributed table, pgjq.queue_route, whose shards decide which
 * node serves a queue name, and registers the queue-first functions for
 * Citus's delegation by their first argument.  Nothing below is used on a
 * single server, and nothing of it changes a single server's behaviour.
 *
 * queue_fence (local on every node): the routing shards this node is moving
 * away (pgjq.move_queues); while a row is here, this node refuses enqueues
 * to the shard's queues and serves their claims and outcomes.
 */
CREATE TABLE pgjq.queue_fence (
	shard			bigint PRIMARY KEY,
	target_group	integer NOT NULL,
	state			"char" NOT NULL DEFAULT 'f',	/* 'f' enqueues refused, 's' claims too */
	since			timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgjq.queue_fence IS 'Citus mode: routing shards this node is moving away (private)';

CREATE FUNCTION pgjq._serve(queue text)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_serve';

CREATE FUNCTION pgjq.route(queue text, OUT node_name text, OUT node_port integer,
						   OUT group_id integer, OUT shard bigint)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_route';
COMMENT ON FUNCTION pgjq.route(text) IS 'Citus mode: the node that serves the queue (connect there to skip the hop), its group and routing shard';

/*
 * The queue-first forms: the queue routes the call (Citus delegates by it),
 * the ids and tokens name the jobs as in the plain forms, which they call.
 * Named *_in rather than overloads of complete/fail/heartbeat: with
 * untyped parameters (node-pg, asyncpg's inference) an overload whose first
 * argument is text would capture today's complete($1, $2, $3).
 */
CREATE FUNCTION pgjq.complete_in(queue text, ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.complete(ids, tokens, results) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.complete_in(text, bigint[], bigint[], jsonb[]) IS 'complete(ids, tokens, results) routed by queue (Citus); returns how many were completed';

CREATE FUNCTION pgjq.fail_in(queue text, id bigint, token bigint, error text DEFAULT NULL,
							 retry_in interval DEFAULT NULL, hold_key_for interval DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.fail(id, token, error, retry_in, hold_key_for) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.fail_in(text, bigint, bigint, text, interval, interval) IS 'fail(id, token, ...) routed by queue (Citus)';

CREATE FUNCTION pgjq.heartbeat_in(queue text, id bigint, token bigint, extend interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.heartbeat(id, token, extend) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.heartbeat_in(text, bigint, bigint, interval) IS 'heartbeat(id, token, extend) routed by queue (Citus)';

CREATE FUNCTION pgjq.snooze_in(queue text, id bigint, token bigint, delay interval)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.snooze(id, token, delay) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.snooze_in(text, bigint, bigint, interval) IS 'snooze(id, token, delay) routed by queue (Citus)';

CREATE FUNCTION pgjq.cancel_in(queue text, ids bigint[])
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.cancel_many(ids) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.cancel_in(text, bigint[]) IS 'cancel_many(ids) routed by queue (Citus)';

CREATE FUNCTION pgjq.job_in(queue text, id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$ SELECT j.* FROM pgjq._serve(queue), pgjq.job(id) j $$;
COMMENT ON FUNCTION pgjq.job_in(text, bigint) IS 'job(id) routed by queue (Citus)';

/*
 * Run on every node by citus_setup(): this node's ids and tokens start at
 * (group + 1) << 48, so an id names the node that issued it (and ids never
 * repeat across nodes); each node's range ends before the next one's.
 */
CREATE FUNCTION pgjq._citus_node_setup()
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g integer := (SELECT groupid FROM pg_catalog.pg_dist_local_group);
	lo bigint;
	hi bigint;
BEGIN
	lo := (g::bigint + 1) << 48;
	hi := lo + ((1::bigint << 48) - 1);
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

/*
 * The rebalance strategy citus_setup() makes Citus's default: Citus's
 * by_shard_count, except that a shard colocated with pgjq.queue_route stays
 * on the node that holds it (moving it would leave its queues' jobs on the
 * old node: pgjq.move_queues() moves queues).
 */
CREATE FUNCTION pgjq.routing_shard_allowed_on_node(shardid bigint, nodeid integer)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
	SELECT NOT EXISTS (
		SELECT 1
		  FROM pg_catalog.pg_dist_shard s
		  JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = s.logicalrelid
		  JOIN pg_catalog.pg_dist_partition r ON r.colocationid = p.colocationid
		 WHERE s.shardid = $1 AND r.logicalrelid = 'pgjq.queue_route'::pg_catalog.regclass)
	OR EXISTS (
		SELECT 1 FROM pg_catalog.pg_dist_placement pl JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
		 WHERE pl.shardid = $1 AND n.nodeid = $2)
$$;
COMMENT ON FUNCTION pgjq.routing_shard_allowed_on_node(bigint, integer) IS 'Citus mode: the shard_allowed_on_node_function of the rebalance strategy pgjq_keeps_queues: a shard colocated with pgjq.queue_route stays on the node that holds it (pgjq.move_queues() moves queues)';

CREATE FUNCTION pgjq.citus_setup(shard_count integer DEFAULT 32)
RETURNS TABLE (node_name text, node_port integer, group_id integer, result text)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f regprocedure;
	n record;
	strat record;
BEGIN
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

	RETURN QUERY
		SELECT d.nodename::text, d.nodeport, d.groupid, r.result
		  FROM pg_catalog.run_command_on_all_nodes('SELECT pgjq._citus_node_setup()') r
		  JOIN pg_catalog.pg_dist_node d ON d.nodeid = r.nodeid
		 ORDER BY d.groupid;
	IF EXISTS (SELECT 1 FROM pg_catalog.run_command_on_all_nodes('SELECT 1') r WHERE NOT r.success) THEN
		RAISE EXCEPTION 'a node could not be reached' USING ERRCODE = 'connection_failure';
	END IF;
END
$$;
COMMENT ON FUNCTION pgjq.citus_setup(integer) IS 'Citus mode: make pgjq.queue_route, delegate the queue-first functions by their queue, give every node its id range; run once on the coordinator (again after adding a node)';

/* ---------------------------------------------- moves (pgjq.move_queues) */

CREATE FUNCTION pgjq._citus_fence(shard bigint, target_group integer, state "char")
RETURNS integer
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_fence';

CREATE FUNCTION pgjq._citus_unfence(shard bigint)
RETURNS boolean
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_unfence';

/* this node's queues of a routing shard, with their settings */
CREATE FUNCTION pgjq._citus_shard_queues(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(jsonb_agg(to_jsonb(q) - 'queue_id' - 'created_at' ORDER BY q.name), '[]')
	  FROM pgjq.queue q
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, q.name) = $1
$$;

/* what this node's queues of a routing shard still hold */
CREATE FUNCTION pgjq._citus_shard_jobs(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT jsonb_build_object('unfinished', coalesce(sum(s.ready + s.scheduled + s.running + s.waiting), 0),
							  'dead', coalesce(sum(s.dead), 0), 'queues', count(*),
							  'schedules', (SELECT count(*) FROM pgjq.schedules p
											 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, p.queue) = $1))
	  FROM pgjq.queue_stats s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = $1
$$;

/* the target's copies of the queues (step 2; the guard is off: it does not serve them yet) */
CREATE FUNCTION pgjq._citus_adopt_queues(queues jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	q jsonb;
	n integer := 0;
BEGIN
	FOR q IN SELECT jsonb_array_elements(queues) LOOP
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgjq.queue WHERE name = q->>'name');
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

/* drop this node's (empty) queues of a routing shard, then its fence */
CREATE FUNCTION pgjq._citus_release_queues(shard bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	q text;
	n integer := 0;
BEGIN
	FOR q IN SELECT name FROM pgjq.queue
			  WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, name) = shard
			  ORDER BY name LOOP
		PERFORM pgjq.drop_queue(q, false);
		n := n + 1;
	END LOOP;
	PERFORM pgjq._citus_unfence(shard);
	RETURN n;
END
$$;

/* run one statement on one node (its own connection and transaction) */
CREATE FUNCTION pgjq._citus_on(node_name text, node_port integer, command text)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
BEGIN
	SELECT * INTO r FROM master_run_on_worker(ARRAY[node_name], ARRAY[node_port], ARRAY[command], false);
	IF NOT r.success THEN
		RAISE EXCEPTION 'on node %:%: %', node_name, node_port, r.result
			USING ERRCODE = 'connection_exception';
	END IF;
	RETURN r.result;
END
$$;

CREATE PROCEDURE pgjq.move_queues(shard bigint, node_name text, node_port integer,
								  drain_wait interval DEFAULT '1 minute')
LANGUAGE plpgsql
AS $$
DECLARE
	src record;
	tgt record;
	n record;
	qs jsonb;
	st jsonb;
	deadline timestamptz;
	fenced "char" := 'f';
BEGIN
	/*
	 * A procedure that commits cannot have a SET clause: the search_path is
	 * set for each of its transactions instead (COMMIT resets it).
	 */
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
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
	SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp INTO src
	  FROM pg_dist_placement p JOIN pg_dist_node d ON d.groupid = p.groupid AND d.noderole = 'primary'
	 WHERE p.shardid = shard ORDER BY p.placementid LIMIT 1;

	IF src.grp = tgt.grp THEN
		/* already there: finish a move cut short after its switch */
		FOR n IN SELECT d.nodename::text AS host, d.nodeport AS port
				   FROM run_command_on_all_nodes(format('SELECT count(*) FROM pgjq.queue_fence WHERE shard = %s', shard)) r
				   JOIN pg_dist_node d ON d.nodeid = r.nodeid
				  WHERE r.success AND r.result <> '0' AND d.groupid <> tgt.grp LOOP
			PERFORM pgjq._citus_on(n.host, n.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
			RAISE NOTICE 'routing shard % was already on %:%; its queues on %:% are dropped now', shard, tgt.host, tgt.port, n.host, n.port;
		END LOOP;
		RETURN;
	END IF;

	st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
	IF (st->>'schedules')::bigint > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % have % periodic jobs on %:%', shard, st->>'schedules', src.host, src.port
			USING ERRCODE = 'object_in_use',
				  DETAIL = 'A schedule lives on the node where it was made and enqueues there; a move does not carry it.',
				  HINT = 'unschedule() them there, move the queues, then schedule() them again through any node.';
	END IF;
	IF (st->>'dead')::bigint > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % hold % dead jobs', shard, st->>'dead'
			USING ERRCODE = 'object_in_use',
				  DETAIL = 'A move carries no job: dead jobs would be dropped with the source''s queues.',
				  HINT = 'Redrive them with retry_dead(queue), or wait until their retention drops them.';
	END IF;

	/* 1. fence the source; 2. the queues on the target */
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''f'')', shard, tgt.grp));
	qs := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_queues(%s)', shard))::jsonb;
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_queues(%L)', qs));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

	/*
	 * 3. the source finishes what it holds; once it is empty its claims are
	 * refused too, and what a claim took meanwhile is finished
	 */
	deadline := clock_timestamp() + drain_wait;
	LOOP
		st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
		IF (st->>'unfinished')::bigint = 0 AND (st->>'dead')::bigint = 0 THEN
			EXIT WHEN fenced = 's';
			PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''s'')', shard, tgt.grp));
			fenced := 's';
			CONTINUE;
		END IF;
		IF clock_timestamp() >= deadline THEN
			PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
			PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_unfence(%s)', shard));
			RAISE EXCEPTION 'the queues of routing shard % still hold % unfinished and % dead jobs after %: nothing moved',
					shard, st->>'unfinished', st->>'dead', drain_wait
				USING ERRCODE = 'object_in_use',
					  DETAIL = 'Enqueues were refused with SQLSTATE PJ002 while the move waited; they are taken again.',
					  HINT = 'Delayed and waiting jobs keep a queue on its node until they run: try again later, or with a longer drain_wait.';
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;

	/* 4. Citus moves the shard group; from its commit calls go to the target */
	PERFORM citus_move_shard_placement(shard, src.host, src.port, tgt.host, tgt.port,
									   shard_transfer_mode := 'block_writes');
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

	/* 5. the source's empty queues and its fence */
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
	RAISE NOTICE 'routing shard % moved from %:% to %:% with % queues', shard, src.host, src.port,
		tgt.host, tgt.port, jsonb_array_length(qs);
END
$$;
COMMENT ON PROCEDURE pgjq.move_queues(bigint, text, integer, interval) IS 'Citus mode: move the queues of a routing shard (and the application shards colocated with it) to another node: enqueues wait (SQLSTATE PJ002) while the source finishes what it holds; nothing moves if it does not within drain_wait';

REVOKE ALL ON FUNCTION pgjq._job_guard(bigint), pgjq._serve(text), pgjq.route(text),
	pgjq.complete_in(text, bigint[], bigint[], jsonb[]),
	pgjq.fail_in(text, bigint, bigint, text, interval, interval),
	pgjq.heartbeat_in(text, bigint, bigint, interval),
	pgjq.snooze_in(text, bigint, bigint, interval),
	pgjq.cancel_in(text, bigint[]), pgjq.job_in(text, bigint),
	pgjq._citus_node_setup(), pgjq.routing_shard_allowed_on_node(bigint, integer),
	pgjq.citus_setup(integer), pgjq._citus_fence(bigint, integer, "char"), pgjq._citus_unfence(bigint),
	pgjq._citus_shard_queues(bigint), pgjq._citus_shard_jobs(bigint), pgjq._citus_adopt_queues(jsonb),
	pgjq._citus_release_queues(bigint), pgjq._citus_on(text, integer, text) FROM PUBLIC;
REVOKE ALL ON PROCEDURE pgjq.move_queues(bigint, text, integer, interval) FROM PUBLIC;
REVOKE ALL ON pgjq.queue_fence FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq._job_guard(bigint), pgjq._serve(text), pgjq.route(text),
	pgjq.complete_in(text, bigint[], bigint[], jsonb[]),
	pgjq.fail_in(text, bigint, bigint, text, interval, interval),
	pgjq.heartbeat_in(text, bigint, bigint, interval),
	pgjq.snooze_in(text, bigint, bigint, interval),
	pgjq.cancel_in(text, bigint[]), pgjq.job_in(text, bigint),
	pgjq._citus_node_setup(), pgjq.routing_shard_allowed_on_node(bigint, integer),
	pgjq.citus_setup(integer), pgjq._citus_fence(bigint, integer, "char"), pgjq._citus_unfence(bigint),
	pgjq._citus_shard_queues(bigint), pgjq._citus_shard_jobs(bigint), pgjq._citus_adopt_queues(jsonb),
	pgjq._citus_release_queues(bigint), pgjq._citus_on(text, integer, text) TO pgjq_admin;
GRANT EXECUTE ON PROCEDURE pgjq.move_queues(bigint, text, integer, interval) TO pgjq_admin;
/* Citus mode: the queue-first forms as their plain forms; route() to both */
GRANT EXECUTE ON FUNCTION
	pgjq.complete_in(text, bigint[], bigint[], jsonb[]),
	pgjq.fail_in(text, bigint, bigint, text, interval, interval),
	pgjq.heartbeat_in(text, bigint, bigint, interval),
	pgjq.snooze_in(text, bigint, bigint, interval)
	TO pgjq_worker;
GRANT EXECUTE ON FUNCTION pgjq.cancel_in(text, bigint[]) TO pgjq_producer;
GRANT EXECUTE ON FUNCTION pgjq.job_in(text, bigint), pgjq.route(text) TO pgjq_producer, pgjq_worker;
