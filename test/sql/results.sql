--
-- results: complete() keeps a result with the completed job (one, or an
-- array of them, and the fused cycle's), job(id) shows it while the job is
-- in the history, pgjq.max_payload_size bounds it; a stale token keeps
-- nothing, and a job completed without a result costs what it did.
--
\set VERBOSITY terse

SELECT pgjq.create_queue('qr', backoff_base => '1 hour');
SELECT count(*) FROM pgjq.enqueue_many('qr', array_fill('{}'::jsonb, ARRAY[8]));
CREATE TEMP TABLE h AS SELECT id, token, row_number() OVER (ORDER BY id) AS n FROM pgjq.claim('qr', 8);

-- one job, with a result; another without (NULL: none)
SELECT pgjq.complete(id, token, '{"sent": true, "msg_id": "m-1"}') FROM h WHERE n = 1;
SELECT pgjq.complete(id, token, NULL) FROM h WHERE n = 2;
SELECT h.n, j.state, j.result FROM h, pgjq.job(h.id) j WHERE h.n <= 2 ORDER BY h.n;

-- a stale token keeps nothing: the job keeps the result it was completed with
SELECT pgjq.complete(id, token, '{"second": "try"}') FROM h WHERE n = 1;
SELECT j.result FROM h, pgjq.job(h.id) j WHERE h.n = 1;

-- the array form: results[i] is ids[i]'s, NULL elements have none
SELECT pgjq.complete(array_agg(id ORDER BY n), array_agg(token ORDER BY n),
                     ARRAY['{"r": 3}', NULL, '[1, 2, 3]']::jsonb[])
  FROM h WHERE n BETWEEN 3 AND 5;
SELECT h.n, j.result FROM h, pgjq.job(h.id) j WHERE h.n BETWEEN 3 AND 5 ORDER BY h.n;

-- the fused cycle: the completed job keeps its result, a failed one none
SELECT count(*) AS claimed
  FROM pgjq.complete_and_claim('qr', (SELECT array_agg(id ORDER BY n) FROM h WHERE n IN (6, 7)),
                               (SELECT array_agg(token ORDER BY n) FROM h WHERE n IN (6, 7)),
                               errors => ARRAY[NULL, 'boom'], results => ARRAY['"done"', '"ignored"']::jsonb[]);
SELECT h.n, j.state, j.result FROM h, pgjq.job(h.id) j WHERE h.n IN (6, 7) ORDER BY h.n;

-- a job whose cancellation was requested ends cancelled, without its result
SELECT pgjq.cancel(id) FROM h WHERE n = 8;
SELECT pgjq.complete(id, token, '{"too": "late"}') FROM h WHERE n = 8;
SELECT j.state, j.result FROM h, pgjq.job(h.id) j WHERE h.n = 8;

-- one job_done row per call and queue; a call without results stores none
SELECT cardinality(ids) AS jobs, results IS NULL AS no_results_column
  FROM pgjq.job_done WHERE queue_id = (SELECT queue_id FROM pgjq.queue WHERE name = 'qr')
 ORDER BY min_id, cardinality(ids);

-- bad input: clear errors, nothing completed
SELECT pgjq.enqueue('qr') AS j \gset
SELECT id AS jid, token AS jtok FROM pgjq.claim('qr', 1) \gset
SELECT pgjq.complete(ARRAY[:jid]::bigint[], ARRAY[:jtok]::bigint[], ARRAY['{}', '{}']::jsonb[]);
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:jid]::bigint[], ARRAY[:jtok]::bigint[], ARRAY[['{}']]::jsonb[]);
\echo :SQLSTATE
SELECT * FROM pgjq.complete_and_claim('qr', ARRAY[:jid]::bigint[], ARRAY[:jtok]::bigint[],
                                      results => ARRAY['{}', '{}']::jsonb[]);
\echo :SQLSTATE
SET pgjq.max_payload_size = 1;
SELECT pgjq.complete(:jid, :jtok, jsonb_build_object('big', repeat('x', 2000)));
\echo :SQLSTATE
SELECT pgjq.complete(ARRAY[:jid]::bigint[], ARRAY[:jtok]::bigint[],
                     ARRAY[jsonb_build_object('big', repeat('x', 2000))]);
\echo :SQLSTATE
RESET pgjq.max_payload_size;
SELECT state FROM pgjq.job(:jid);
SELECT pgjq.complete(:jid, :jtok, '"fits"');
SELECT state, result FROM pgjq.job(:jid);

SELECT * FROM pgjq.verify();
SELECT pgjq.drop_queue('qr');
