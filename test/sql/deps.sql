--
-- deps: enqueue(..., after) and enqueue_many(..., after): a job waits until
-- every job it names has completed, then becomes ready (or scheduled with a
-- run_at); a dependency that ends dead or cancelled cancels it (a reason
-- names the dependency) unless on_dependency_failure => 'run'; cancel
-- cascades the same way.  The worker serves no database here: promote()
-- does what it would (deps.c).  Bad inputs fail with nothing stored.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qd', backoff_base => '1 hour', max_attempts => 1);

-- a chain a -> b, and a diamond r -> (x, y) -> z in one enqueue_many call
SELECT pgjq.enqueue('qd', '{"n": "a"}') AS a \gset
SELECT pgjq.enqueue('qd', '{"n": "b"}', after => ARRAY[:a]::bigint[]) AS b \gset
CREATE TEMP TABLE g AS
SELECT x AS id, row_number() OVER () AS n
  FROM pgjq.enqueue_many('qd', ARRAY['{"n": "r"}', '{"n": "x"}', '{"n": "y"}', '{"n": "z"}']::jsonb[],
                         after => ARRAY['[]', '["#1"]', '["#1"]', '["#2", "#3"]']::jsonb[]) x;
SELECT g.n, j.state,
       j.waiting_for = ARRAY(SELECT id FROM g WHERE n IN (2, 3) ORDER BY id) AS on_x_y,
       j.waiting_for = ARRAY(SELECT id FROM g WHERE n = 1) AS on_r
  FROM g, pgjq.job(g.id) j ORDER BY g.n;
SELECT j.state, j.waiting_for = ARRAY[:a]::bigint[] AS on_a FROM pgjq.job(:b) j;
SELECT ready, waiting FROM pgjq.queue_stats WHERE queue = 'qd';
-- metrics() counts them too (pgjq_jobs{state="waiting"})
SELECT labels->>'state' AS state, value FROM pgjq.metrics('qd') WHERE name = 'pgjq_jobs' ORDER BY 1;

-- only a and r can be claimed: the others wait
CREATE TEMP TABLE c AS SELECT id, token, payload->>'n' AS n FROM pgjq.claim('qd', 10);
SELECT n FROM c ORDER BY n;
SELECT count(*) FROM pgjq.claim('qd', 10);

-- completing a releases b once the worker (here promote()) has looked; r's
-- completion releases x and y, not z
SELECT pgjq.complete(id, token) FROM c ORDER BY n;
SELECT pgjq.promote() AS promoted;
SELECT j.state, j.waiting_for FROM pgjq.job(:b) j;
SELECT g.n, j.state FROM g, pgjq.job(g.id) j ORDER BY g.n;
TRUNCATE c;
INSERT INTO c SELECT id, token, payload->>'n' FROM pgjq.claim('qd', 10);
SELECT n FROM c ORDER BY n;

-- z waits for both: one done is not enough
SELECT pgjq.complete(id, token) FROM c WHERE n = 'x';
SELECT pgjq.promote() AS promoted;
SELECT j.state, j.waiting_for = ARRAY(SELECT id FROM g WHERE n = 3) AS on_y
  FROM g, pgjq.job(g.id) j WHERE g.n = 4;
SELECT pgjq.complete(id, token) FROM c WHERE n IN ('y', 'b');
SELECT pgjq.promote() AS promoted;
SELECT j.state, j.waiting_for FROM g, pgjq.job(g.id) j WHERE g.n = 4;
SELECT payload->>'n' AS n FROM pgjq.claim('qd', 10);
SELECT waiting FROM pgjq.queue_stats WHERE queue = 'qd';
SELECT value FROM pgjq.metrics('qd') WHERE name = 'pgjq_jobs' AND labels->>'state' = 'waiting';

-- a dependent with a run_at becomes scheduled, not ready
SELECT pgjq.enqueue('qd', '{"n": "p"}') AS p \gset
SELECT pgjq.enqueue('qd', '{"n": "later"}', delay => '1 hour', after => ARRAY[:p]::bigint[]) AS later \gset
SELECT pgjq.complete(id, token) FROM pgjq.claim('qd', 10);
SELECT pgjq.promote() AS promoted;
SELECT state, run_at > now() + interval '50 minutes' AS later FROM pgjq.job(:later);
SELECT pgjq.cancel(:later);

-- failure: a dead dependency cancels its dependents, naming it, and the
-- cancel cascades down a chain; on_dependency_failure => 'run' runs anyway
SELECT pgjq.enqueue('qd', '{"n": "f"}') AS f \gset
SELECT pgjq.enqueue('qd', '{"n": "f1"}', after => ARRAY[:f]::bigint[]) AS f1 \gset
SELECT pgjq.enqueue('qd', '{"n": "f2"}', after => ARRAY[:f1]::bigint[]) AS f2 \gset
SELECT pgjq.enqueue('qd', '{"n": "frun"}', after => ARRAY[:f]::bigint[],
                    on_dependency_failure => 'run') AS frun \gset
SELECT pgjq.fail(id, token, 'boom') FROM pgjq.claim('qd', 10);
SELECT pgjq.promote() AS promoted;
SELECT pgjq.promote() AS promoted;
SELECT j.id = :f1 AS is_f1, j.state, j.last_error = 'dependency ' || :f || ' ended dead' AS names_f
  FROM pgjq.job(:f1) j;
SELECT j.state, j.last_error = 'dependency ' || :f1 || ' ended cancelled' AS names_f1 FROM pgjq.job(:f2) j;
SELECT state FROM pgjq.job(:frun);
SELECT payload->>'n' AS n FROM pgjq.claim('qd', 10);

-- cancel of a waiting job, and cancel of a job others wait for (cascade)
SELECT pgjq.enqueue('qd', '{"n": "k"}', delay => '1 hour') AS k \gset
SELECT pgjq.enqueue('qd', '{"n": "k1"}', after => ARRAY[:k]::bigint[]) AS k1 \gset
SELECT pgjq.enqueue('qd', '{"n": "k2"}', after => ARRAY[:k]::bigint[]) AS k2 \gset
SELECT pgjq.cancel(:k1);
SELECT state FROM pgjq.job(:k1);
SELECT pgjq.cancel(:k);
SELECT pgjq.promote() AS promoted;
SELECT state, last_error = 'dependency ' || :k || ' ended cancelled' AS names_k FROM pgjq.job(:k2);

-- a dependency that finished before the enqueue: released at the first look
SELECT pgjq.enqueue('qd', '{"n": "done"}') AS done \gset
SELECT pgjq.complete(id, token) FROM pgjq.claim('qd', 10);
SELECT pgjq.enqueue('qd', '{"n": "after_done"}', after => ARRAY[:done]::bigint[]) AS ad \gset
SELECT state FROM pgjq.job(:ad);
SELECT pgjq.promote() AS promoted;
SELECT state FROM pgjq.job(:ad);
SELECT payload->>'n' AS n FROM pgjq.claim('qd', 10);

-- an enqueue that rolls back leaves no waiting job and no edge
BEGIN;
SELECT pgjq.enqueue('qd', '{"n": "rolled"}', after => ARRAY[:done]::bigint[]) IS NOT NULL AS enqueued;
ROLLBACK;
SELECT count(*) FROM pgjq.job_dependency;
SELECT waiting FROM pgjq.queue_stats WHERE queue = 'qd';

-- an empty after is no dependency at all
SELECT pgjq.enqueue('qd', '{"n": "free"}', after => '{}') AS free \gset
SELECT state, waiting_for FROM pgjq.job(:free);
SELECT count(*) FROM pgjq.claim('qd', 10);

-- bad inputs: clear errors, nothing stored
SELECT pgjq.enqueue('qd', '{}', after => ARRAY[999999999]::bigint[]);
SELECT pgjq.enqueue('qd', '{}', after => ARRAY[NULL]::bigint[]);
SELECT pgjq.enqueue('qd', '{}', after => ARRAY[:done]::bigint[], dedup_key => 'k');
SELECT pgjq.enqueue('qd', '{}', after => ARRAY[:done]::bigint[], on_dependency_failure => 'ignore');
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['["#2"]', '[]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '["#2"]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '["#0"]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '["x"]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '{"a": 1}']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '[1.5]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '[-3]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], after => ARRAY['[]', '[999999999]']::jsonb[]);
SELECT * FROM pgjq.enqueue_many('qd', ARRAY['{}', '{}']::jsonb[], dedup_keys => ARRAY['a', 'b'],
                                after => ARRAY['[]', '["#1"]']::jsonb[]);
SELECT count(*) FROM pgjq.job_dependency;
SELECT waiting, ready FROM pgjq.queue_stats WHERE queue = 'qd';

-- two-phase commit cannot carry the worker's wake-up
BEGIN;
SELECT pgjq.enqueue('qd', '{"n": "2pc"}', after => ARRAY[:done]::bigint[]) IS NOT NULL AS enqueued;
PREPARE TRANSACTION 'pgjq_deps';
SELECT count(*) FROM pgjq.job_dependency;

-- dropping the queue drops its waiting jobs
SELECT pgjq.enqueue('qd', '{"n": "w"}', delay => '1 hour') AS w \gset
SELECT pgjq.enqueue('qd', '{"n": "w1"}', after => ARRAY[:w]::bigint[]) IS NOT NULL AS enqueued;
SELECT pgjq.drop_queue('qd', force => true);
SELECT pgjq.promote() AS promoted;
SELECT count(*) FROM pgjq.job WHERE state = 'w';
SELECT count(*) FROM pgjq.job_dependency;
SELECT * FROM pgjq.verify();
