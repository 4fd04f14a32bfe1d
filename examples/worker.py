"""A pgjq worker in Python (psycopg 3).  Usage: python3 worker.py "dbname=app" emails"""
import sys
import psycopg


def run(payload):
    print("running", payload)


def main(dsn, queue):
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            jobs = conn.execute(
                "SELECT id, token, payload FROM pgjq.claim(%s, batch => 10, wait => '10 s')",
                (queue,)).fetchall()
            done_ids, done_tokens = [], []
            for job_id, token, payload in jobs:
                try:
                    run(payload)
                    done_ids.append(job_id)
                    done_tokens.append(token)
                except Exception as exc:  # report the failure; pgjq retries with backoff
                    outcome = conn.execute("SELECT pgjq.fail(%s, %s, %s)",
                                           (job_id, token, repr(exc))).fetchone()[0]
                    print("job", job_id, "failed:", outcome)
            if done_ids:
                conn.execute("SELECT pgjq.complete(%s::bigint[], %s::bigint[])",
                             (done_ids, done_tokens))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
