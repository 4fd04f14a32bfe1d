--
-- key_rate: claims started per second per fair key, with key_burst as the
-- bucket (0: the larger of 1 and key_rate), exact across workers
-- (test/specs/key_rate_race.spec).  A key without a token is out of the
-- round robin until its next one; other keys go on.
--
\set VERBOSITY terse

-- a rate so low that no token comes back while the test runs
SELECT pgjq.create_queue('kr', key_rate => 0.001, key_burst => 2);
SELECT count(*) FROM pgjq.enqueue_many('kr', array_fill('{}'::jsonb, ARRAY[9]),
                                       fair_keys => ARRAY['a', 'a', 'a', 'a', 'b', 'b', 'b', NULL, NULL]);
-- each key (the jobs without one are one key) gets its burst, no more
SELECT coalesce(fair_key, '-') AS key, count(*) FROM pgjq.claim('kr', 20) GROUP BY 1 ORDER BY 1;
SELECT count(*) AS nothing_more FROM pgjq.claim('kr', 20);
SELECT ready, running, held_back FROM pgjq.queue_stats WHERE queue = 'kr';
-- both claims were held back by key_rate (the first took the buckets, the second found none)
SELECT labels->>'limit' AS limit, value FROM pgjq.metrics('kr')
 WHERE name = 'pgjq_claims_held_back_total' AND value > 0;
-- a new key starts with a full bucket
SELECT pgjq.enqueue('kr', fair_key => 'c') IS NOT NULL AS enqueued;
SELECT fair_key FROM pgjq.claim('kr', 20);
-- a bigger bucket (alter_queue) fills at the rate, not at once
SELECT pgjq.alter_queue('kr', key_burst => 3);
SELECT count(*) AS still_nothing FROM pgjq.claim('kr', 20);
-- removing the rate: the rest at once
SELECT pgjq.alter_queue('kr', key_rate => 0);
SELECT count(*) AS the_rest FROM pgjq.claim('kr', 20);
SELECT key_rate, key_burst FROM pgjq.list_queues() WHERE queue = 'kr';

-- a real rate: 4 per second, bucket 1; a waiting claim gets the next token
-- (the default bucket would be 4)
SELECT pgjq.create_queue('kr2', key_rate => 4, key_burst => 1);
SELECT count(*) FROM pgjq.enqueue_many('kr2', array_fill('{}'::jsonb, ARRAY[3]),
                                       fair_keys => ARRAY['a', 'a', 'a']);
SELECT count(*) AS first FROM pgjq.claim('kr2', 10);
SELECT count(*) AS at_once FROM pgjq.claim('kr2', 10);
SELECT count(*) AS waited_for_the_token FROM pgjq.claim('kr2', 10, wait => '5 seconds');
SELECT count(*) AS and_the_next FROM pgjq.claim('kr2', 10, wait => '5 seconds');
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'kr2';
SELECT key_rate, key_burst FROM pgjq.list_queues() WHERE queue = 'kr2';
SELECT queue, key_rate FROM pgjq.queue_stats WHERE queue LIKE 'kr%' ORDER BY 1;

-- bad settings: clear errors, nothing changed
SELECT pgjq.create_queue('kr3', key_rate => -1);
SELECT pgjq.create_queue('kr3', key_rate => 'NaN');
SELECT pgjq.create_queue('kr3', key_rate => 1000001);
SELECT pgjq.create_queue('kr3', key_burst => -1);
SELECT pgjq.alter_queue('kr2', key_burst => 1000001);
SELECT count(*) AS no_kr3 FROM pgjq.list_queues() WHERE queue = 'kr3';
SELECT key_rate, key_burst FROM pgjq.list_queues() WHERE queue = 'kr2';

-- purge takes the ready jobs of a key that is out until its next token
SELECT pgjq.create_queue('kr4', key_rate => 0.001, key_burst => 1);
SELECT count(*) FROM pgjq.enqueue_many('kr4', array_fill('{}'::jsonb, ARRAY[3]), fair_keys => ARRAY['a', 'a', 'a']);
SELECT count(*) FROM pgjq.claim('kr4', 10);
SELECT pgjq.purge('kr4') AS purged;
SELECT ready, running FROM pgjq.queue_stats WHERE queue = 'kr4';

SELECT pgjq.drop_queue('kr', force => true), pgjq.drop_queue('kr2', force => true),
       pgjq.drop_queue('kr4', force => true);
SELECT area, object, expected, found FROM pgjq.verify();
