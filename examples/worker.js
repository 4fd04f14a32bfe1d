#!/usr/bin/env node
// A pgjq worker in Node.js with node-postgres (Debian: node-pg; npm: pg).
//
// Usage:  node worker.js URL QUEUE
//         node worker.js postgres://app@localhost:6432/app emails
// Debian's node-pg lives in /usr/share/nodejs, which a nodejs not from Debian (NodeSource's,
// say) does not search: run it as  NODE_PATH=/usr/share/nodejs node worker.js ...
//
// Settings (environment variables):
//   PGJQ_BATCH   jobs claimed at a time (10)
//   PGJQ_LEASE   seconds a claim leases a job for; held jobs are heartbeaten every third of it (30)
//   PGJQ_WAIT    seconds a claim waits in the server for a job (2: short, for PgBouncer; see
//                README, "Drivers and PgBouncer")
//   PGJQ_WORKER  the worker name pgjq.job() shows (node-HOST-PID)
//
// The loop: claim a batch (waiting in the server when there is nothing to do), run each job,
// report failures at once with fail() and the error text, complete the successes in one call.
// A timer extends the leases of the jobs it holds while they run.  On SIGTERM or SIGINT it
// finishes the job it is running, reports, hands back the jobs it has not started (snooze,
// which spends no attempt) and exits.
//
// Through PgBouncer in transaction mode: node-postgres sends a query with parameters as an
// unnamed statement, which is safe.  Never give a query a `name`: that makes it a named
// prepared statement, which lives on one server connection and breaks behind PgBouncer below
// 1.21 ("prepared statement ... does not exist").
'use strict';
const os = require('os');
const { Client } = require('pg');

const BATCH = parseInt(process.env.PGJQ_BATCH || '10', 10);
const LEASE = parseFloat(process.env.PGJQ_LEASE || '30');
const WAIT = parseFloat(process.env.PGJQ_WAIT || '2');
const NAME = process.env.PGJQ_WORKER || `node-${os.hostname()}-${process.pid}`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// DEMO HANDLER: replace with your own.  Return to succeed; throw to fail the attempt (the
// error's text becomes the job's last_error, and pgjq retries it with backoff).
// This one understands payloads like {"sleep": 1.5} and {"fail": "message"}.
async function handle(payload) {
  if (payload === null || typeof payload !== 'object') return;
  await sleep(1000 * Number(payload.sleep || 0));
  if ('fail' in payload) throw new Error(String(payload.fail));
}
// ---------------------------------------------------------------------------------------------

let stopping = false;
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => { stopping = true; });

// node-postgres returns bigint as a string: ids and tokens stay strings and go back with
// ::bigint casts.  The client queues queries, so the timer and the loop can share it.
async function work(client, queue) {
  const held = new Map(); // id -> token: claimed and not yet reported
  const lost = new Set(); // held jobs whose heartbeat said stale or cancelled
  const beat = setInterval(async () => {
    if (held.size === 0) return;
    try {
      // One statement for all held jobs; it returns those whose lease is gone.
      const r = await client.query(
        'SELECT h.id FROM unnest($1::bigint[], $2::bigint[]) AS h(id, token)' +
        ' WHERE pgjq.heartbeat(h.id, h.token, $3::interval) IS NULL',
        [[...held.keys()], [...held.values()], `${LEASE} seconds`]);
      for (const { id } of r.rows) {
        if (held.has(id)) { lost.add(id); console.log(`job ${id} lost`); }
      }
    } catch (err) {
      console.log('heartbeat failed:', err.message); // the loop sees a broken connection too
    }
  }, (LEASE / 3) * 1000);
  try {
    while (!stopping) {
      const { rows: jobs } = await client.query(
        'SELECT id, token, payload FROM pgjq.claim($1::text, batch => $2::integer,' +
        ' lease => $3::interval, worker => $4::text, wait => $5::interval)',
        [queue, BATCH, `${LEASE} seconds`, NAME, `${WAIT} seconds`]);
      if (jobs.length === 0) continue;
      console.log(`claimed ${jobs.length}`);
      held.clear();
      lost.clear();
      for (const job of jobs) held.set(job.id, job.token);
      const doneIds = [];
      const doneTokens = [];
      const unstarted = [];
      for (const job of jobs) {
        if (stopping) { unstarted.push(job); continue; }
        if (lost.has(job.id)) { held.delete(job.id); continue; } // rescued or cancelled
        try {
          await handle(job.payload);
        } catch (err) {
          held.delete(job.id);
          const r = await client.query(
            'SELECT pgjq.fail($1::bigint, $2::bigint, $3::text) AS outcome',
            [job.id, job.token, `${err.name}: ${err.message}`]);
          console.log(`job ${job.id} ${r.rows[0].outcome}: ${err.message}`);
          continue;
        }
        doneIds.push(job.id);
        doneTokens.push(job.token);
      }
      if (doneIds.length > 0) {
        for (const id of doneIds) held.delete(id);
        const r = await client.query(
          'SELECT pgjq.complete($1::bigint[], $2::bigint[]) AS n', [doneIds, doneTokens]);
        console.log(`completed ${r.rows[0].n} of ${doneIds.length}`);
      }
      for (const job of unstarted) { // stopping: back to the queue, no attempt spent
        held.delete(job.id);
        await client.query("SELECT pgjq.snooze($1::bigint, $2::bigint, '0 s')",
          [job.id, job.token]);
      }
      if (unstarted.length > 0) console.log(`released ${unstarted.length}`);
    }
  } finally {
    clearInterval(beat);
  }
}

async function main(url, queue) {
  console.log(`worker ${NAME} started`);
  while (!stopping) {
    const client = new Client({ connectionString: url, application_name: NAME });
    client.on('error', (err) => console.log('connection error:', err.message));
    try {
      await client.connect();
      await work(client, queue);
    } catch (err) { // server or pooler gone: jobs held come back when their lease expires
      console.log('connection lost, reconnecting:', err.message);
      await sleep(1000);
    } finally {
      await client.end().catch(() => {});
    }
  }
  console.log(`worker ${NAME} stopped`);
}

if (process.argv.length !== 4) {
  console.error('usage: node worker.js URL QUEUE');
  process.exit(2);
}
main(process.argv[2], process.argv[3]).catch((err) => { console.error(err); process.exit(1); });
