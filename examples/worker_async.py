#!/usr/bin/env python3
"""A pgjq worker in Python with asyncpg (Debian: python3-asyncpg; pip: asyncpg).

Usage:  python3 worker_async.py DSN QUEUE
        python3 worker_async.py postgresql://app@localhost:6432/app emails

Settings (environment variables):
  PGJQ_BATCH   jobs claimed at a time (10)
  PGJQ_LEASE   seconds a claim leases a job for; held jobs are heartbeaten every third of it (30)
  PGJQ_WAIT    seconds a claim waits in the server for a job (2: short, for PgBouncer; see
               README, "Drivers and PgBouncer")
  PGJQ_WORKER  the worker name pgjq.job() shows (asyncpg-HOST-PID)

The loop: claim a batch (waiting in the server when there is nothing to do), run each job,
report failures at once with fail() and the error text, complete the successes in one call.
A background task extends the leases of the jobs it holds while they run.  On SIGTERM or
SIGINT it finishes the job it is running, reports, hands back the jobs it has not started
(snooze, which spends no attempt) and exits.

statement_cache_size=0 matters: asyncpg otherwise keeps named prepared statements on the
server connection, and PgBouncer below 1.21 (or without max_prepared_statements) in
transaction mode hands the next transaction another server connection, where they do not
exist ("prepared statement "__asyncpg_stmt_1__" does not exist").  With the cache off asyncpg
uses unnamed statements, which live only as long as the transaction.
"""
import asyncio
import datetime
import json
import os
import signal
import socket
import sys

import asyncpg

BATCH = int(os.environ.get("PGJQ_BATCH", "10"))
LEASE = float(os.environ.get("PGJQ_LEASE", "30"))
WAIT = float(os.environ.get("PGJQ_WAIT", "2"))
NAME = os.environ.get("PGJQ_WORKER") or f"asyncpg-{socket.gethostname()}-{os.getpid()}"


# ----------------------------------------------------------------------------------------------
# DEMO HANDLER: replace with your own.  Return to succeed; raise to fail the attempt (the
# exception's text becomes the job's last_error, and pgjq retries it with backoff).  Blocking
# code belongs in loop.run_in_executor(), or the heartbeat task cannot run.
# This one understands payloads like {"sleep": 1.5} and {"fail": "message"}.
async def handle(payload):
    if not isinstance(payload, dict):
        return
    await asyncio.sleep(float(payload.get("sleep", 0)))
    if "fail" in payload:
        raise RuntimeError(str(payload["fail"]))
# ----------------------------------------------------------------------------------------------


def log(*args):
    print(*args, flush=True)


class Worker:
    def __init__(self, conn, queue, stopping):
        self.conn = conn
        self.queue = queue
        self.stopping = stopping
        self.lock = asyncio.Lock()  # an asyncpg connection runs one statement at a time
        self.held = {}  # id -> token: claimed and not yet reported
        self.lost = set()  # held jobs whose heartbeat said stale or cancelled

    async def call(self, method, sql, *args):
        async with self.lock:
            return await getattr(self.conn, method)(sql, *args)

    async def heartbeat(self):
        """Every LEASE/3 seconds, extends the lease of every job the worker holds."""
        extend = datetime.timedelta(seconds=LEASE)
        while True:
            await asyncio.sleep(LEASE / 3)
            if not self.held:
                continue
            ids, tokens = list(self.held), list(self.held.values())
            try:
                # One statement for all held jobs; it returns those whose lease is gone.
                rows = await self.call(
                    "fetch",
                    "SELECT h.id FROM unnest($1::bigint[], $2::bigint[]) AS h(id, token)"
                    " WHERE pgjq.heartbeat(h.id, h.token, $3::interval) IS NULL",
                    ids, tokens, extend)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log("heartbeat failed:", exc)  # the main loop sees a broken connection too
                continue
            for row in rows:
                if row["id"] in self.held:
                    self.lost.add(row["id"])
                    log(f"job {row['id']} lost")

    async def run(self):
        lease = datetime.timedelta(seconds=LEASE)
        wait = datetime.timedelta(seconds=WAIT)
        while not self.stopping.is_set():
            jobs = await self.call(
                "fetch",
                "SELECT id, token, payload FROM pgjq.claim($1::text, batch => $2::integer,"
                " lease => $3::interval, worker => $4::text, wait => $5::interval)",
                self.queue, BATCH, lease, NAME, wait)
            if not jobs:
                continue
            log(f"claimed {len(jobs)}")
            self.held = {job["id"]: job["token"] for job in jobs}
            self.lost = set()
            done, unstarted = [], []
            for job in jobs:
                job_id, token = job["id"], job["token"]
                if self.stopping.is_set():
                    unstarted.append((job_id, token))
                    continue
                if job_id in self.lost:  # rescued or cancelled before we got to it
                    del self.held[job_id]
                    continue
                try:
                    await handle(json.loads(job["payload"]))  # asyncpg returns jsonb as text
                except Exception as exc:
                    del self.held[job_id]
                    outcome = await self.call(
                        "fetchval", "SELECT pgjq.fail($1::bigint, $2::bigint, $3::text)",
                        job_id, token, f"{type(exc).__name__}: {exc}")
                    log(f"job {job_id} {outcome}: {exc}")
                    continue
                done.append((job_id, token))
            if done:
                for job_id, _ in done:
                    del self.held[job_id]
                n = await self.call(
                    "fetchval", "SELECT pgjq.complete($1::bigint[], $2::bigint[])",
                    [i for i, _ in done], [t for _, t in done])
                log(f"completed {n} of {len(done)}")
            for job_id, token in unstarted:  # stopping: back to the queue, no attempt spent
                del self.held[job_id]
                await self.call("execute",
                                "SELECT pgjq.snooze($1::bigint, $2::bigint, '0 s')", job_id, token)
            if unstarted:
                log(f"released {len(unstarted)}")


async def main(dsn, queue):
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log(f"worker {NAME} started")
    while not stopping.is_set():
        try:
            conn = await asyncpg.connect(dsn, statement_cache_size=0,
                                         server_settings={"application_name": NAME})
        except (OSError, asyncpg.PostgresError) as exc:
            log("cannot connect, retrying:", exc)
            await asyncio.sleep(1)
            continue
        worker = Worker(conn, queue, stopping)
        beat = asyncio.create_task(worker.heartbeat())
        try:
            await worker.run()
        except (OSError, asyncpg.InterfaceError,
                asyncpg.exceptions.ConnectionDoesNotExistError) as exc:
            log("connection lost, reconnecting:", exc)  # jobs held come back when their
            await asyncio.sleep(1)                      # lease expires
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            conn.terminate()
    log(f"worker {NAME} stopped")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
