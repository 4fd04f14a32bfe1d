#!/usr/bin/python3
"""bench/lib/report.py: turn bench/run's raw measurements into results.

    report.py line REPDIR
        one summary line for one measured window (printed while running)
    report.py report RUNDIR --out PREFIX [--docs FILE]
        PREFIX.json (median, min and max of every metric, and each window),
        PREFIX.md (the tables) and PREFIX.png (chart, when gnuplot exists);
        with --docs, the tables and chart link replace the marked section of
        FILE (docs/benchmarks.md)
    report.py versions --out PREFIX [--docs FILE] [--failed TEXT]... MAJOR=JSON...
        PREFIX.md: the table of each PostgreSQL version's run (its JSON
        from "report"), each with pgjq's ratios against that run's own
        baseline, and those ratios side by side; --failed names a version
        that was not measured and why

Each window's directory holds "kv" (key=value lines written by bench/run:
counters before and after, the per-job denominator "jobs", how to get the
window's duration and latency) and pgbench's per-transaction logs.
Standard library only.
"""

import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ORDER = ["E1", "E2", "E3", "D1B1", "D1B10", "D2", "D3", "H1", "L1", "L1W", "F1", "FL1", "M1",
         "W1", "W2", "B1S", "B1L", "B2N", "B2R", "F2", "S1"]

# B1 and B2: claim throughput in a large case over a small one (O(batch))
SCALING = [("B1", "B1L", "B1S", "claim jobs/s with the large backlog / with the small one"),
           ("B2", "B2R", "B2N", "claim jobs/s with many jobs running / with none")]
SYSTEMS = ["pgjq", "baseline"]

# scenarios measured for pgjq only, and the baseline row their ratios are
# taken against (the baseline cannot run them: it has no server-side wait)
PGJQ_ONLY = {"L1W": "L1"}

# scenarios whose systems do not do the same work: said next to the ratios
CAVEAT = {"FL1": "pgjq held to key_concurrency 2, the baseline unlimited"}

# L1W's pickup p99 target (issue: under 5 ms at 200 jobs/s, loopback)
L1W_P99_TARGET_MS = 5.0

TITLE = {
    "E1": "enqueue 10,000 jobs in one call",
    "E2": "1,000 enqueues, one transaction each, 1 client",
    "E3": "4 producers, enqueue_many(100), timed",
    "D1B1": "drain pre-seeded jobs, 20 clients, claim(1) then complete",
    "D1B10": "drain pre-seeded jobs, 20 clients, claim(10) then complete",
    "D2": "sustained claim(10) + complete over a backlog, 8 clients",
    "D3": "D2 as one transaction per cycle: complete_and_claim(10) completes the "
          "batch held and claims the next, 8 clients",
    "H1": "D2 while a REPEATABLE READ xid pins the horizon",
    "L1": "pickup latency at ~200 jobs/s offered",
    "L1W": "L1 with claim(..., wait => '1 s') instead of polling; pgjq only, "
           "its ratios are against the baseline's L1 (polling), as the baseline cannot wait",
    "F1": "deferred frontier: delayed jobs falling due, 4 workers",
    "FL1": "fairness and limits: tenant t0's backlog seeded first, then ten small tenants "
           "t1..t10; 8 clients claim(10) then complete; pgjq with key_concurrency 2, "
           "the baseline without (it has no such option)",
    "M1": "mixed: producers at 500 jobs/s, 4 workers, 5% fail and retry",
    "W1": "WAL by operation, one client: enqueue_many of all jobs in one call, then "
          "claim(10) per transaction, then complete(ids, tokens) of ten per transaction",
    "W2": "W1 with one enqueue per transaction",
    "B1S": "claim(10) + complete, 8 clients, over a small backlog (B1's reference)",
    "B1L": "the same window over a large backlog",
    "B2N": "claim(10) + complete, 8 clients, nothing running (B2's reference)",
    "B2R": "the same window with many jobs of the queue running under 1-hour leases",
    "F2": "F1 behind a large frontier: many jobs delayed, coming due at 1,000/s, 4 workers",
    "S1": "space: millions of jobs through in rounds (enqueue, drain by 8 clients) while one "
          "job is heartbeated and one delayed 30 days; the system's relation size after the "
          "first rounds and at the end",
}

# metrics kept per window; "better" says which direction wins
METRICS = [
    ("jobs_s", "jobs/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("wal_per_job", "WAL bytes/job"),
    ("commits_per_job", "commits/job"),
    ("dead_per_job", "dead tuples created/job"),
    ("hot_per_job", "HOT updates/job"),
    ("ins_per_job", "tuples inserted/job"),
    ("dead_end", "n_dead_tup at end"),
    ("growth_mb", "table+index growth MB"),
    ("jobs", "jobs in window"),
    ("secs", "window s"),
]


def read_kv(path):
    kv = {"note": []}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if "=" not in line:
                continue
            k, v = line.split("=", 1)
            if k == "note":
                kv["note"].append(v)
            elif k == "prepared":
                kv.setdefault("prepared_all", []).append(v)
            else:
                kv[k] = v
    return kv


def lsn(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def percentile(values, p):
    """linear interpolation between closest ranks, as percentile_cont"""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * p
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def pgbench_log(repdir, prefix):
    """(starts, ends, latencies in s) of every logged transaction"""
    starts, ends, lats = [], [], []
    for path in glob.glob(os.path.join(repdir, prefix + ".*")):
        if not re.search(r"\.\d+(\.\d+)?$", path):
            continue
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or not parts[2].isdigit():
                    continue  # "skipped" (-L) or a malformed line
                lat = int(parts[2]) / 1e6
                end = int(parts[4]) + int(parts[5]) / 1e6
                starts.append(end - lat)
                ends.append(end)
                lats.append(lat)
    return starts, ends, lats


def measure(repdir):
    """the metrics of one window, or {"error": ...}"""
    kv = read_kv(os.path.join(repdir, "kv"))
    notes = kv["note"] + ([kv["waits"]] if "waits" in kv else [])
    out = {"scenario": kv.get("scenario"), "system": kv.get("system"),
           "rep": int(kv.get("rep", 0)), "notes": notes,
           "lat_what": kv.get("lat_what", "")}
    for k in ("claimed", "depth_end", "dead_jobs"):
        if k in kv:
            out[k] = kv[k]
    out["ran_dry"] = kv.get("ran_dry") == "1"
    if "fair_first" in kv:
        out["fairness"] = fairness(kv)
    if "error" in kv:
        out["error"] = kv["error"].strip() or "failed"
        return out
    try:
        jobs = int(kv["jobs"])
        window = kv.get("window", "main")
        if window == "snap":
            secs = float(kv["t_after"]) - float(kv["t_before"])
        elif window == "first_due":
            secs = float(kv["sample_last"]) - float(kv["t_first_due"])
        elif window == "main_to_last_sample":
            # FL1: first claim of the workers to the last completion
            starts, _, _ = pgbench_log(repdir, "main")
            secs = float(kv["sample_last"]) - min(starts)
        else:
            starts, ends, _ = pgbench_log(repdir, window)
            secs = max(ends) - min(starts)
        if kv.get("lat") == "pgbench":
            _, _, lats = pgbench_log(repdir, "main")
            p50, p99 = percentile(lats, 0.5), percentile(lats, 0.99)
        elif kv.get("lat") == "none":
            p50 = p99 = None
        else:
            p50 = float(kv["lat_p50"]) if kv.get("lat_p50") else None
            p99 = float(kv["lat_p99"]) if kv.get("lat_p99") else None
        d = {k: int(kv[k + "_after"]) - int(kv[k + "_before"])
             for k in ("ins", "upd", "hot", "del", "commits", "sessions")}
        # pgbench's connection start-ups and statement preparations commit
        # too; they are the harness's, not the system's: leave them out
        prepared = sum(int(x) for x in kv.get("prepared_all", []))
        harness = d["sessions"] + prepared
        d["commits_raw"] = d["commits"]
        d["commits"] = d["commits"] - harness
        d["commits_harness"] = harness
        wal = lsn(kv["lsn_after"]) - lsn(kv["lsn_before"])
        per = (lambda x: x / jobs) if jobs > 0 else (lambda x: None)
        if "wal_phases" in kv and jobs > 0:
            marks = [lsn(x) for x in kv["wal_phases"].split()]
            out["wal_split"] = {"enqueue": (marks[1] - marks[0]) / jobs,
                                "claim": (marks[2] - marks[1]) / jobs,
                                "outcome": (marks[3] - marks[2]) / jobs}
        out.update({
            "jobs": jobs,
            "secs": secs,
            "jobs_s": jobs / secs if secs > 0 else None,
            "p50_ms": p50 * 1000 if p50 is not None else None,
            "p99_ms": p99 * 1000 if p99 is not None else None,
            "wal_bytes": wal,
            "commits": d["commits"],
            "wal_per_job": per(wal),
            "commits_per_job": per(d["commits"]),
            "dead_per_job": per(d["upd"] + d["del"]),
            "hot_per_job": per(d["hot"]),
            "ins_per_job": per(d["ins"]),
            "tuples": d,
            "dead_end": int(kv["dead_after"]),
            "growth_mb": (int(kv["size_after"]) - int(kv["size_before"])) / 1048576,
            "settle_ms": int(kv.get("settle_ms", 0)),
        })
    except (KeyError, ValueError, ZeroDivisionError) as e:
        out["error"] = "incomplete measurement (%s: %s)" % (type(e).__name__, e)
    return out


def fairness(kv):
    """FL1: the tenants' shares of the first claims, from bench/run's kv"""
    first = int(kv["fair_first"] or 0)
    small_got, small_all = (int(x) for x in kv["fair_small_claimed"].split("/"))
    share = (lambda c: 100.0 * int(c or 0) / first) if first else (lambda c: None)
    counts = {}
    for item in (kv.get("fair_counts") or "").split(","):
        if ":" in item:
            k, c = item.split(":", 1)
            counts[k] = int(c)
    return {
        "first_claims": first,
        "limit": kv.get("fair_limit", ""),
        "counts": counts,
        "t0_pct": share(kv["fair_t0"]),
        "small_min_pct": share(kv["fair_small_min"]),
        "small_max_pct": share(kv["fair_small_max"]),
        "small_claimed": small_got,
        "small_total": small_all,
        # claim number and time (s after the first claim) of the last
        # small-tenant job: meaningful once all of them were claimed
        "small_last_claim": int(kv["fair_small_last_rank"] or 0) if small_got == small_all else None,
        "small_last_s": float(kv["fair_small_last_s"] or 0) if small_got == small_all else None,
    }


# ----------------------------------------------------------------- format

def fmt_num(x, kind):
    if x is None:
        return "–"
    if kind == "jobs_s":
        return "{:,.0f}".format(x) if x >= 100 else "{:,.1f}".format(x)
    if kind == "ms":
        return "{:.2f}".format(x) if x < 10 else "{:,.0f}".format(x)
    if kind == "bytes":
        return "{:,.0f}".format(x)
    if kind == "ratio":
        return "{:.2f}".format(x)
    return "{:.2f}".format(x) if abs(x) < 100 else "{:,.0f}".format(x)


def ratio(a, b):
    if a is None or b is None:
        return None
    if b == 0:
        return None if a != 0 else 1.0
    return a / b


def fmt_ratio(r):
    return "–" if r is None else "{:.2f}×".format(r)


def line(repdir):
    m = measure(repdir)
    if "error" in m:
        return "FAILED: " + m["error"]
    lat = "%s/%s ms" % (fmt_num(m["p50_ms"], "ms"), fmt_num(m["p99_ms"], "ms"))
    s = "%8s jobs/s  p50/p99 %-15s WAL %6s B/job  commits %5s/job  dead %5s/job" % (
        fmt_num(m["jobs_s"], "jobs_s"), lat, fmt_num(m["wal_per_job"], "bytes"),
        fmt_num(m["commits_per_job"], ""), fmt_num(m["dead_per_job"], ""))
    if m.get("fairness"):
        s += "  " + fair_text(m["fairness"])
    if m.get("wal_split"):
        s += "  WAL B/job: enqueue %s, claim %s, outcome %s" % tuple(
            fmt_num(m["wal_split"][k], "bytes") for k in ("enqueue", "claim", "outcome"))
    if m["notes"]:
        s += "  (" + "; ".join(m["notes"]) + ")"
    return s


def fmt_pct(x):
    return "–" if x is None else "{:.1f}%".format(x)


def fair_text(f):
    """one FL1 window's fairness, in a few words"""
    s = "first %s claims: t0 %s, t1..t10 %s–%s" % (
        "{:,}".format(f["first_claims"]), fmt_pct(f["t0_pct"]), fmt_pct(f["small_min_pct"]),
        fmt_pct(f["small_max_pct"]))
    if f["small_last_claim"] is not None:
        s += "; all small-tenant jobs claimed by claim #{:,} ({:.2f} s)".format(
            f["small_last_claim"], f["small_last_s"])
    else:
        s += "; small-tenant jobs claimed: {:,} of {:,}".format(f["small_claimed"], f["small_total"])
    return s


def aggregate(runs):
    """{(scenario, system): {"metrics": {k: {median,min,max}}, ...}}"""
    groups = {}
    for r in runs:
        groups.setdefault((r["scenario"], r["system"]), []).append(r)
    agg = {}
    for key, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        metrics = {}
        for k, _ in METRICS:
            vals = [r[k] for r in ok if r.get(k) is not None]
            if vals:
                metrics[k] = {"median": statistics.median(vals), "min": min(vals),
                              "max": max(vals)}
        notes = []
        for r in rs:
            for n in r["notes"]:
                if n not in notes and not n.startswith("horizon pinned by xid"):
                    notes.append(n)
        rs_ok = sorted(ok, key=lambda r: r["rep"])
        if any("claimed" in r for r in rs_ok):
            got = [r["claimed"].split("/") for r in rs_ok if "claimed" in r]
            everything = all(g[0] == g[1] for g in got)
            notes.append("%s claimed, per run: %s of %s" % (
                "all" if everything else "NOT ALL",
                ", ".join("{:,}".format(int(g[0])) for g in got), "{:,}".format(int(got[0][1]))))
        if any("depth_end" in r for r in rs_ok):
            notes.append("queue depth at the end, per run: %s; dead jobs: %s" % (
                ", ".join(r.get("depth_end", "?") for r in rs_ok),
                ", ".join(r.get("dead_jobs", "?") for r in rs_ok)))
        agg[key] = {
            "scenario": key[0], "system": key[1], "reps": len(rs), "ok": len(ok),
            "ran_dry": sum(1 for r in ok if r.get("ran_dry")),
            "errors": [r["error"] for r in rs if "error" in r],
            "lat_what": next((r["lat_what"] for r in rs if r["lat_what"]), ""),
            "notes": notes, "metrics": metrics,
        }
        split = [r["wal_split"] for r in rs_ok if r.get("wal_split")]
        if split:
            agg[key]["wal_split"] = {k: statistics.median(x[k] for x in split)
                                     for k in ("enqueue", "claim", "outcome")}
        fair = [r["fairness"] for r in rs_ok if r.get("fairness")]
        if fair:
            fa = {"limit": fair[0]["limit"], "first_claims": fair[0]["first_claims"],
                  "per_run": fair}
            for k in ("t0_pct", "small_min_pct", "small_max_pct", "small_claimed",
                      "small_last_claim", "small_last_s"):
                vals = [f[k] for f in fair if f[k] is not None]
                fa[k] = statistics.median(vals) if len(vals) == len(fair) else None
            fa["small_total"] = fair[0]["small_total"]
            agg[key]["fairness"] = fa
    return agg


def med(agg, scn, sys_, k):
    a = agg.get((scn, sys_))
    if not a or k not in a["metrics"]:
        return None
    return a["metrics"][k]["median"]


def tables(agg, meta):
    scns = [s for s in ORDER if any((s, y) in agg for y in SYSTEMS)]
    systems = [y for y in SYSTEMS if any((s, y) in agg for s in scns)]
    both = len(systems) == 2
    out = []
    out.append("| scenario | system | jobs/s | p50 / p99 ms | WAL B/job | commits/job "
               "| dead tuples/job | pgjq/baseline: jobs/s · WAL · commits · dead |")
    out.append("|---|---|--:|--:|--:|--:|--:|--:|")
    for s in scns:
        for y in systems:
            a = agg.get((s, y))
            if a is None:
                continue
            if not a["metrics"]:
                out.append("| %s | %s | failed: %s | | | | | |" % (
                    s, y, (a["errors"] or ["?"])[0].replace("|", "/")[:120]))
                continue
            g = lambda k: med(agg, s, y, k)
            cell = ""
            if y == "pgjq" and s in PGJQ_ONLY:
                # measured for pgjq only: against the baseline's row of a
                # related scenario, when it was measured
                ref = PGJQ_ONLY[s]
                if (ref, "baseline") in agg and agg[(ref, "baseline")]["metrics"]:
                    cell = "vs baseline %s: " % ref + " · ".join(
                        fmt_ratio(ratio(g(k), med(agg, ref, "baseline", k)))
                        for k in ("jobs_s", "wal_per_job", "commits_per_job", "dead_per_job"))
                else:
                    cell = "n/a (pgjq only)"
            elif both and y == "pgjq":
                cell = " · ".join(fmt_ratio(ratio(g(k), med(agg, s, "baseline", k)))
                                  for k in ("jobs_s", "wal_per_job", "commits_per_job",
                                            "dead_per_job"))
                if s in CAVEAT:
                    cell += " (%s)" % CAVEAT[s]
            dry = ""
            if a.get("ran_dry"):
                dry = " ⚠ ran dry" if a["ran_dry"] == a["ok"] else " ⚠ ran dry %d/%d" % (
                    a["ran_dry"], a["ok"])
            out.append("| %s | %s | %s%s | %s / %s | %s | %s | %s | %s |" % (
                s, y, fmt_num(g("jobs_s"), "jobs_s"), dry, fmt_num(g("p50_ms"), "ms"),
                fmt_num(g("p99_ms"), "ms"), fmt_num(g("wal_per_job"), "bytes"),
                fmt_num(g("commits_per_job"), ""), fmt_num(g("dead_per_job"), ""), cell))
    dry = ["%s %s (%d of %d runs)" % (a["scenario"], a["system"], a["ran_dry"], a["ok"])
           for a in (agg[k] for k in sorted(agg, key=lambda k: (
               ORDER.index(k[0]) if k[0] in ORDER else 99, k[1])))
           if a.get("ran_dry")]
    if dry:
        out.append("")
        out.append("**Warning: the backlog ran out inside the window** (the clients stopped "
                   "early; the figure is a drain's, not a sustained rate's, and the ratio "
                   "compares unlike windows): " + "; ".join(dry) + ".")
    main = "\n".join(out)

    det = ["| scenario | system | runs ok | jobs/s min–max | WAL B/job min–max "
           "| HOT upd/job | n_dead_tup at end | growth MB | notes |",
           "|---|---|--:|--:|--:|--:|--:|--:|---|"]
    for s in scns:
        for y in systems:
            a = agg.get((s, y))
            if a is None:
                continue
            m = a["metrics"]
            rng = lambda k, kind: ("%s–%s" % (fmt_num(m[k]["min"], kind), fmt_num(m[k]["max"], kind))
                                   if k in m else "–")
            notes = list(a["notes"]) + ["error: " + e[:100] for e in a["errors"]]
            det.append("| %s | %s | %d/%d | %s | %s | %s | %s | %s | %s |" % (
                s, y, a["ok"], a["reps"], rng("jobs_s", "jobs_s"), rng("wal_per_job", "bytes"),
                fmt_num(med(agg, s, y, "hot_per_job"), ""),
                fmt_num(med(agg, s, y, "dead_end"), "bytes"),
                fmt_num(med(agg, s, y, "growth_mb"), ""),
                "; ".join(notes).replace("|", "/")))
    details = "\n".join(det)

    scn_lines = []
    for s in scns:
        what = next((agg[(s, y)]["lat_what"] for y in systems
                     if (s, y) in agg and agg[(s, y)]["lat_what"]), "")
        scn_lines.append("- **%s**: %s. Latency: %s." % (s, TITLE.get(s, s), what or "–"))
    legend = "\n".join(scn_lines)

    tgt = []
    if both:
        for s in ("D1B1", "D1B10", "D2"):
            if (s, "pgjq") not in agg or (s, "baseline") not in agg:
                continue
            rj = ratio(med(agg, s, "pgjq", "jobs_s"), med(agg, s, "baseline", "jobs_s"))
            rw = ratio(med(agg, s, "pgjq", "wal_per_job"), med(agg, s, "baseline", "wal_per_job"))
            rc = ratio(med(agg, s, "pgjq", "commits_per_job"),
                       med(agg, s, "baseline", "commits_per_job"))
            mark = lambda ok: "met" if ok else "**not met**"
            # "not above the baseline" allows 0.5% for background commits and
            # WAL (autovacuum, pgjq's worker) that fall into a window
            tgt.append("- %s: jobs/s %s (target ≥ 1.5×: %s); WAL/job %s (≤ 1×: %s); "
                       "commits/job %s (≤ 1×: %s)" % (
                           s, fmt_ratio(rj), mark(rj is not None and rj >= 1.5),
                           fmt_ratio(rw), mark(rw is not None and rw <= 1.005),
                           fmt_ratio(rc), mark(rc is not None and rc <= 1.005)))
    a = agg.get(("L1W", "pgjq"))
    if a and a["metrics"]:
        p99 = med(agg, "L1W", "pgjq", "p99_ms")
        line = "- L1W: pickup p99 %s ms with claim's wait (target < %g ms at ~200 jobs/s: %s)" % (
            fmt_num(p99, "ms"), L1W_P99_TARGET_MS,
            "met" if p99 is not None and p99 < L1W_P99_TARGET_MS else "**not met**")
        b = med(agg, "L1", "baseline", "p99_ms")
        if b is not None:
            line += "; the baseline's polling L1: p99 %s ms" % fmt_num(b, "ms")
        tgt.append(line)
    targets = "\n".join(tgt)

    fair = ["| scenario | system | limit | jobs/s | first claims | t0's share | "
            "t1..t10 share min–max | all small-tenant jobs claimed by | per run |",
            "|---|---|---|--:|--:|--:|--:|--:|---|"]
    for s in scns:
        for y in systems:
            a = agg.get((s, y))
            if a is None or "fairness" not in a:
                continue
            f = a["fairness"]
            if f["small_last_claim"] is not None:
                by = "claim #{:,} ({:.2f} s)".format(int(f["small_last_claim"]), f["small_last_s"])
            else:
                by = "not all: {:,} of {:,} claimed".format(int(f["small_claimed"] or 0),
                                                          f["small_total"])
            fair.append("| %s | %s | %s | %s | %s | %s | %s–%s | %s | %s |" % (
                s, y, f["limit"], fmt_num(med(agg, s, y, "jobs_s"), "jobs_s"),
                "{:,}".format(f["first_claims"]), fmt_pct(f["t0_pct"]),
                fmt_pct(f["small_min_pct"]), fmt_pct(f["small_max_pct"]), by,
                "; ".join(",".join("%s:%d" % kc for kc in r["counts"].items())
                          for r in f["per_run"])))
    fairness_table = "\n".join(fair) if len(fair) > 2 else ""

    # W1/W2: WAL per job by operation; B1/B2: claim scaling
    extra = []
    wal = ["| scenario | system | enqueue | claim | outcome | whole life | pgjq/baseline whole life |",
           "|---|---|--:|--:|--:|--:|--:|"]
    for s in ("W1", "W2"):
        for y in systems:
            a = agg.get((s, y))
            if a is None or "wal_split" not in a:
                continue
            w = a["wal_split"]
            tot = sum(w.values())
            cell = ""
            b = agg.get((s, "baseline"))
            if y == "pgjq" and b and "wal_split" in b:
                cell = fmt_ratio(ratio(tot, sum(b["wal_split"].values())))
            wal.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                s, y, fmt_num(w["enqueue"], "bytes"), fmt_num(w["claim"], "bytes"),
                fmt_num(w["outcome"], "bytes"), fmt_num(tot, "bytes"), cell))
    if len(wal) > 2:
        extra += ["WAL bytes per job by operation (W1, W2; medians), each operation measured "
                  "as its own phase with one client:", "", "\n".join(wal), ""]
    sc = ["| measure | system | large case jobs/s | small case jobs/s | ratio |",
          "|---|---|--:|--:|--:|"]
    for name, big, small, what in SCALING:
        for y in systems:
            jb, js = med(agg, big, y, "jobs_s"), med(agg, small, y, "jobs_s")
            if jb is None or js is None:
                continue
            sc.append("| %s: %s | %s | %s | %s | %s |" % (
                name, what, y, fmt_num(jb, "jobs_s"), fmt_num(js, "jobs_s"),
                fmt_ratio(ratio(jb, js))))
    if len(sc) > 2:
        extra += ["Claim cost against backlog and running jobs (B1, B2; 1.0× means a claim "
                  "costs the same however much waits or runs):", "", "\n".join(sc), ""]
    return main, details, legend, targets, fairness_table, "\n".join(extra)


def chart(agg, png):
    """two panels: jobs/s and WAL bytes/job per scenario, per system"""
    if not shutil.which("gnuplot"):
        return False
    scns = [s for s in ORDER if any((s, y) in agg for y in SYSTEMS)]
    systems = [y for y in SYSTEMS if any((s, y) in agg for s in scns)]
    with tempfile.TemporaryDirectory() as tmp:
        dat = os.path.join(tmp, "data")
        with open(dat, "w") as f:
            for s in scns:
                row = [s]
                for k in ("jobs_s", "wal_per_job"):
                    for y in systems:
                        v = med(agg, s, y, k)
                        row.append("%.3f" % v if v else "NaN")
                f.write(" ".join(row) + "\n")
        n = len(systems)
        colors = {"pgjq": "#1f77b4", "baseline": "#aaaaaa"}
        jobs_plot = ", ".join("'%s' using %d:xtic(1) title '%s' lc rgb '%s'" % (
            dat, 2 + i, y, colors[y]) for i, y in enumerate(systems))
        wal_plot = ", ".join("'%s' using %d:xtic(1) title '%s' lc rgb '%s'" % (
            dat, 2 + n + i, y, colors[y]) for i, y in enumerate(systems))
        script = """
set terminal pngcairo size 1100,800 font 'sans,10'
set output '%s'
set multiplot layout 2,1 title 'pgjq vs plain-SQL baseline (median of runs; same cluster, same run)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top right
set logscale y
set format y '%%.0s%%c'
set ylabel 'jobs/s (log scale)'
plot %s
unset logscale y
set format y '%%g'
set yrange [0:*]
set ylabel 'WAL bytes per job'
set key top left
plot %s
unset multiplot
""" % (png, jobs_plot, wal_plot)
        gp = os.path.join(tmp, "chart.gp")
        with open(gp, "w") as f:
            f.write(script)
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write("gnuplot failed: %s\n" % r.stderr)
            return False
    return True


def report(rundir, prefix, docs):
    meta = read_kv(os.path.join(rundir, "meta"))
    meta_conf = [l.split("=", 1)[1] for l in open(os.path.join(rundir, "meta"))
                 if l.startswith("conf=")]
    runs = []
    for kvp in sorted(glob.glob(os.path.join(rundir, "*", "*", "*", "kv"))):
        runs.append(measure(os.path.dirname(kvp)))
    runs.sort(key=lambda r: (ORDER.index(r["scenario"]) if r["scenario"] in ORDER else 99,
                             r["system"], r["rep"]))
    agg = aggregate(runs)
    main, details, legend, targets, fairness_table, extra = tables(agg, meta)

    result = {
        "stamp": meta.get("stamp"),
        "quick": meta.get("quick") == "1",
        "reps": int(meta.get("reps", 1)),
        "duration_s": int(meta.get("duration_s", 0)),
        "machine": {k: meta.get(k) for k in ("cpu", "cores", "ram_gib", "kernel", "os")},
        "software": {k: meta.get(k) for k in ("server_version", "pg_major", "pg_bindir",
                                              "data_checksums", "pgjq_version", "git_commit",
                                              "git_dirty", "pgbench")},
        "configuration": [c.strip() for c in meta_conf],
        "promotion": meta.get("promotion"),
        "poll_ms": meta.get("poll_ms"),
        "wait": meta.get("wait"),
        "sizes": meta.get("sizes"),
        "results": [agg[k] for k in sorted(agg, key=lambda k: (
            ORDER.index(k[0]) if k[0] in ORDER else 99, SYSTEMS.index(k[1])))],
        "runs": runs,
    }
    with open(prefix + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    png = prefix + ".png"
    have_chart = chart(agg, png)
    head = ("Run %s: %s, %s cores, %s GiB; PostgreSQL %s, pgjq %s (commit %s%s); %s; "
            "%s run(s) per scenario, median shown; promotion for pgjq: %s." % (
                meta.get("stamp"), meta.get("cpu"), meta.get("cores"), meta.get("ram_gib"),
                meta.get("server_version"), meta.get("pgjq_version"), meta.get("git_commit"),
                ", uncommitted changes in src/ or sql/" if meta.get("git_dirty", "0") != "0" else "",
                "quick sizes" if meta.get("quick") == "1" else "full sizes",
                meta.get("reps"), meta.get("promotion")))
    md = [head, "", main, ""]
    if targets:
        md += ["Targets (pgjq against the baseline, and L1W's pickup latency; \"≤ 1×\" "
               "allows 0.5% for background activity):", "", targets, ""]
    if fairness_table:
        md += ["Fairness (FL1; medians of the runs): each tenant's share of the first claims, "
               "in claim order (claim time, then token). With fair round-robin across the 11 "
               "tenants each gets 1/11 ≈ 9.1% until the small tenants run out; FIFO gives t0 "
               "everything it enqueued first. Per run: jobs per tenant among the first claims.",
               "", fairness_table, ""]
    if extra:
        md += [extra]
    md += ["Scenarios and what their latency measures:", "", legend, "",
           "Details (medians unless a range is shown):", "", details, ""]
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(md))

    print()
    print(main)
    if targets:
        print()
        print(targets)
    if fairness_table:
        print()
        print(fairness_table)
    if extra:
        print()
        print(extra)
    if docs:
        body = "\n".join(md)
        if have_chart:
            rel = os.path.relpath(png, os.path.dirname(os.path.abspath(docs)))
            body += "\n![jobs/s and WAL bytes per job, per scenario](%s)\n" % rel
        update_docs(docs, body)


def update_docs(docs, body):
    """replace the results section of docs (between its bench:results markers) with body"""
    begin, end = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"
    text = open(docs).read()
    if begin not in text or end not in text:
        sys.stderr.write("%s: no %s ... %s section; not updated\n" % (docs, begin, end))
        return
    text = text[:text.index(begin) + len(begin)] + "\n" + body + "\n" + text[text.index(end):]
    with open(docs, "w") as f:
        f.write(text)
    print("\nupdated %s" % docs)


def load_agg(path):
    """a "report" JSON back into (meta-like dict, agg keyed by (scenario, system))"""
    with open(path) as f:
        res = json.load(f)
    agg = {(a["scenario"], a["system"]): a for a in res["results"]}
    return res, agg


def geomean(xs):
    xs = [x for x in xs if x]
    if not xs:
        return None
    p = 1.0
    for x in xs:
        p *= x
    return p ** (1.0 / len(xs))


def versions(prefix, docs, failed, pairs):
    """PREFIX.md: each version's table, then pgjq's ratios side by side"""
    runs = []
    for pair in pairs:
        major, path = pair.split("=", 1)
        res, agg = load_agg(path)
        runs.append((major, path, res, agg))
    md = []
    head = ("Run %s: PostgreSQL %s, one after the other, each on its own throwaway cluster "
            "with the same configuration, pgjq and the baseline measured back to back on it; "
            "each version's ratios are against its own baseline." % (
                os.path.basename(prefix), ", ".join(r[0] for r in runs) or "none"))
    md += [head, ""]
    for f in failed:
        md += ["- **PostgreSQL %s**" % f]
    if failed:
        md.append("")
    for major, path, res, agg in runs:
        sw = res["software"]
        main, _, _, targets, _, _ = tables(agg, {})
        md += ["### PostgreSQL %s" % sw.get("server_version"), "",
               "%s; pgjq %s (commit %s%s); %s, %s run(s) per scenario, median shown; data "
               "checksums %s; details in `%s`." % (
                   res["machine"].get("cpu"), sw.get("pgjq_version"), sw.get("git_commit"),
                   ", uncommitted changes in src/ or sql/" if sw.get("git_dirty", "0") != "0" else "",
                   "quick sizes" if res.get("quick") else "full sizes", res.get("reps"),
                   sw.get("data_checksums") or "?", os.path.basename(path)[:-5] + ".md"),
               "", main, ""]
        if targets:
            md += [targets, ""]
    # side by side: the scenarios every version measured for both systems
    if len(runs) > 1:
        scns = [s for s in ORDER if all((s, "pgjq") in r[3] and (s, "baseline") in r[3]
                                         and r[3][(s, "pgjq")]["metrics"]
                                         and r[3][(s, "baseline")]["metrics"] for r in runs)]
        cols = [r[0] for r in runs]
        t = ["| scenario | " + " | ".join("pgjq jobs/s on %s" % c for c in cols) + " | "
             + " | ".join("pgjq/baseline jobs/s on %s" % c for c in cols) + " | "
             + " | ".join("pgjq/baseline WAL/job on %s" % c for c in cols) + " |",
             "|---|" + "--:|" * (3 * len(cols))]
        jr = {c: [] for c in cols}
        for s in scns:
            cells_j, cells_r, cells_w = [], [], []
            for major, _, _, agg in runs:
                pj, bj = med(agg, s, "pgjq", "jobs_s"), med(agg, s, "baseline", "jobs_s")
                r = ratio(pj, bj)
                jr[major].append(r)
                dry = " ⚠" if agg[(s, "pgjq")].get("ran_dry") or agg[(s, "baseline")].get("ran_dry") else ""
                cells_j.append(fmt_num(pj, "jobs_s"))
                cells_r.append(fmt_ratio(r) + dry)
                cells_w.append(fmt_ratio(ratio(med(agg, s, "pgjq", "wal_per_job"),
                                               med(agg, s, "baseline", "wal_per_job"))))
            t.append("| %s | %s | %s | %s |" % (s, " | ".join(cells_j), " | ".join(cells_r),
                                                 " | ".join(cells_w)))
        if scns:
            summary = ("pgjq's jobs/s against its own baseline, geometric mean over the %d "
                       "scenarios measured on every version: %s." % (
                           len(scns), ", ".join("%s on %s" % (fmt_ratio(geomean(jr[c])), c)
                                                for c in cols)))
            own = [ratio(med(runs[-1][3], s, "pgjq", "jobs_s"), med(runs[0][3], s, "pgjq", "jobs_s"))
                   for s in scns]
            base = [ratio(med(runs[-1][3], s, "baseline", "jobs_s"),
                          med(runs[0][3], s, "baseline", "jobs_s")) for s in scns]
            summary += (" On %s over %s: pgjq's own jobs/s %s, the baseline's %s (geometric "
                        "means; a shared, noisy machine moves single figures by 10-30%%)." % (
                            cols[-1], cols[0], fmt_ratio(geomean(own)), fmt_ratio(geomean(base))))
            md += ["### Side by side", "", summary, "", "\n".join(t), ""]
            print()
            print(summary)
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(md))
    for major, _, _, agg in runs:
        print()
        print("PostgreSQL %s:" % major)
        print(tables(agg, {})[0])
    if docs:
        body = "\n".join(md)
        for major, path, _, _ in runs:
            png = path[:-5] + ".png"
            if os.path.exists(png):
                rel = os.path.relpath(png, os.path.dirname(os.path.abspath(docs)))
                body += "\n![PostgreSQL %s: jobs/s and WAL bytes per job](%s)\n" % (major, rel)
        update_docs(docs, body)


def main(argv):
    if len(argv) >= 3 and argv[0] == "versions" and argv[1] == "--out":
        prefix, docs, failed, pairs = argv[2], None, [], []
        rest = argv[3:]
        i = 0
        while i < len(rest):
            if rest[i] == "--docs":
                docs = rest[i + 1]
                i += 2
            elif rest[i] == "--failed":
                failed.append(rest[i + 1])
                i += 2
            else:
                pairs.append(rest[i])
                i += 1
        versions(prefix, docs, failed, pairs)
        return 0
    if len(argv) >= 2 and argv[0] == "line":
        print(line(argv[1]))
        return 0
    if len(argv) >= 4 and argv[0] == "report" and argv[2] == "--out":
        docs = argv[argv.index("--docs") + 1] if "--docs" in argv else None
        report(argv[1], argv[3], docs)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
