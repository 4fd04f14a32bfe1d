#!/usr/bin/python3
"""bench/lib/waldump_stats.py: turn `pg_waldump --stats=record` output into
per-job figures.

    waldump_stats.py JOBS < waldump-output

Prints one line per record type: type, records per job, record bytes per job,
full-page-image bytes per job; then a TOTAL line.  Record types that cost
less than 0.5 bytes per job in all are folded into "other".
"""
import re
import sys

LINE = re.compile(r"^(?P<type>\S+/\S+)\s+(?P<n>\d+)\s+\(\s*[\d.]+\)\s+"
                  r"(?P<rec>\d+)\s+\(\s*[\d.]+\)\s+(?P<fpi>\d+)\s+\(")


def main():
    jobs = float(sys.argv[1])
    rows = []
    for line in sys.stdin:
        m = LINE.match(line)
        if m:
            rows.append((m["type"], int(m["n"]), int(m["rec"]), int(m["fpi"])))
    rows.sort(key=lambda r: -(r[2] + r[3]))
    other = [0, 0, 0]
    total = [0, 0, 0]
    for typ, n, rec, fpi in rows:
        total = [total[0] + n, total[1] + rec, total[2] + fpi]
        if (rec + fpi) / jobs < 0.5:
            other = [other[0] + n, other[1] + rec, other[2] + fpi]
            continue
        print(f"{typ}\t{n / jobs:.3f}\t{rec / jobs:.1f}\t{fpi / jobs:.1f}")
    if other[0]:
        print(f"other\t{other[0] / jobs:.3f}\t{other[1] / jobs:.1f}\t{other[2] / jobs:.1f}")
    print(f"TOTAL\t{total[0] / jobs:.3f}\t{total[1] / jobs:.1f}\t{total[2] / jobs:.1f}")


if __name__ == "__main__":
    main()
