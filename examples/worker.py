#!/usr/bin/env python3
"""A pgjq worker in Python with psycopg 3 (Debian: python3-psycopg; pip: psycopg).

Usage:  python3 worker.py DSN QUEUE
        python3 worker.py "host=localhost port=6432 dbname=app" emails

Settings (environment variables):
  PGJQ_BATCH   jobs claimed at a time (10)
  PGJQ_LEASE   seconds a claim leases a job for; held jobs are heartbeaten every third of it (30)
  PGJQ_WAIT    seconds a claim waits in the server for a job (2: short, for PgBouncer; see
               README, "Drivers and PgBouncer")
  PGJQ_WORKER  the worker name pgjq.job() shows (psycopg-HOST-PID)

The loop: claim a batch (waiting in the server when there is nothing to do), run each job,
report failures at once with fail() and the error text, complete the successes in one call.
A background thread extends the leases of the jobs it holds while they run.  On SIGTERM or
SIGINT it finishes the job it is running, reports, hands back the jobs it has not started
(snooze, which spends no attempt) and exits.

prepare_threshold=None matters: psycopg 3 otherwise prepares a statement on the server after it
ran five times, and PgBouncer below 1.21 (or without max_prepared_statements) in transaction
mode hands the next transaction another server connection, where that statement does not
exist ("prepared statement "_pg3_0" does not exist" / "already exists").
"""
import datetime
import os
import signal
import socket
import sys
import threading
import time

import psycopg

BATCH = int(os.environ.get("PGJQ_BATCH", "10"))
LEASE = float(os.environ.get("PGJQ_LEASE", "30"))
WAIT = float(os.environ.get("PGJQ_WAIT", "2"))
NAME = os.environ.get("PGJQ_WORKER") or f"psycopg-{socket.gethostname()}-{os.getpid()}"


# ----------------------------------------------------------------------------------------------
# DEMO HANDLER: replace with your own.  Return to succeed; raise to fail the attempt (the
# exception's text becomes the job's last_error, and pgjq retries it with backoff).
# This one understands payloads like {"sleep": 1.5} and {"fail": "message"}.
def handle(payload):
    if not isinstance(payload, dict):
        return
    time.sleep(float(payload.get("sleep", 0)))
    if "fail" in payload:
        raise RuntimeError(str(payload["fail"]))
# ----------------------------------------------------------------------------------------------


def log(*args):
    print(*args, flush=True)


class Heartbeat(threading.Thread):
    """Every LEASE/3 seconds, extends the lease of every job the worker holds."""

    def __init__(self, conn):
        super().__init__(daemon=True)
        self.conn = conn  # psycopg serialises this thread's and the main thread's calls
        self.lock = threading.Lock()
        self.held = {}  # id -> token: claimed and not yet reported
        self.lost = set()  # held jobs whose heartbeat said stale or cancelled
        self.done = threading.Event()

    def hold(self, jobs):
        with self.lock:
            self.held = {job_id: token for job_id, token, _ in jobs}
            self.lost = set()

    def drop(self, job_id):
        with self.lock:
            self.held.pop(job_id, None)

    def is_lost(self, job_id):
        with self.lock:
            return job_id in self.lost

    def run(self):
        extend = datetime.timedelta(seconds=LEASE)
        while not self.done.wait(LEASE / 3):
            with self.lock:
                ids, tokens = list(self.held), list(self.held.values())
            if not ids:
                continue
            try:
                # One statement for all held jobs; it returns those whose lease is gone.
                rows = self.conn.execute(
                    "SELECT h.id FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token)"
                    " WHERE pgjq.heartbeat(h.id, h.token, %s::interval) IS NULL",
                    (ids, tokens, extend)).fetchall()
            except psycopg.Error as exc:  # the main loop sees a broken connection too
                log("heartbeat failed:", exc)
                continue
            with self.lock:
                for (job_id,) in rows:
                    if job_id in self.held:
                        self.lost.add(job_id)
                        log(f"job {job_id} lost")


def work(conn, queue, stopping):
    lease = datetime.timedelta(seconds=LEASE)
    wait = datetime.timedelta(seconds=WAIT)
    heartbeat = Heartbeat(conn)
    heartbeat.start()
    try:
        while not stopping.is_set():
            jobs = conn.execute(
                "SELECT id, token, payload FROM pgjq.claim(%s::text, batch => %s::integer,"
                " lease => %s::interval, worker => %s::text, wait => %s::interval)",
                (queue, BATCH, lease, NAME, wait)).fetchall()
            if not jobs:
                continue
            log(f"claimed {len(jobs)}")
            heartbeat.hold(jobs)
            done_ids, done_tokens, unstarted = [], [], []
            for job_id, token, payload in jobs:
                if stopping.is_set():
                    unstarted.append((job_id, token))
                    continue
                if heartbeat.is_lost(job_id):  # rescued or cancelled before we got to it
                    heartbeat.drop(job_id)
                    continue
                try:
                    handle(payload)
                except Exception as exc:
                    heartbeat.drop(job_id)
                    outcome = conn.execute("SELECT pgjq.fail(%s::bigint, %s::bigint, %s::text)",
                                           (job_id, token, f"{type(exc).__name__}: {exc}")
                                           ).fetchone()[0]
                    log(f"job {job_id} {outcome}: {exc}")
                    continue
                done_ids.append(job_id)
                done_tokens.append(token)
            if done_ids:
                for job_id in done_ids:
                    heartbeat.drop(job_id)
                n = conn.execute("SELECT pgjq.complete(%s::bigint[], %s::bigint[])",
                                 (done_ids, done_tokens)).fetchone()[0]
                log(f"completed {n} of {len(done_ids)}")
            for job_id, token in unstarted:  # stopping: back to the queue, no attempt spent
                heartbeat.drop(job_id)
                conn.execute("SELECT pgjq.snooze(%s::bigint, %s::bigint, '0 s')", (job_id, token))
            if unstarted:
                log(f"released {len(unstarted)}")
    finally:
        heartbeat.done.set()


def main(dsn, queue):
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    log(f"worker {NAME} started")
    while not stopping.is_set():
        try:
            # autocommit: every call is its own transaction (what transaction pooling needs).
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None,
                                 application_name=NAME) as conn:
                work(conn, queue, stopping)
        except psycopg.OperationalError as exc:  # server or pooler gone: jobs held come back
            log("connection lost, reconnecting:", exc)  # when their lease expires
            stopping.wait(1)
    log(f"worker {NAME} stopped")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
