#!/usr/bin/env python3
"""bench/lib/citus_report.py: bench/citus's figures.

  citus_report.py line RUN CELL_ID     one cell's summary (one line)
  citus_report.py report RUN --out F   the table (median of the repetitions),
                                       the comparisons and what they mean on
                                       more cores: written to F, printed too

RUN/cells.txt has one line per measured cell (key=value pairs; cpu0/cpu1 and
wal0/wal1 are [name=value,...] lists), RUN/cells/<id>/ its pgbench output,
logs and `time` of each pgbench process, RUN/meta the machine and settings.
"""
import glob
import os
import re
import statistics
import sys

HZ = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count()
SYS_NAME = {"single": "single server", "direct": "Citus, direct to the owner",
            "coord": "Citus, through the coordinator"}
WL_NAME = {"plain": "claim(10) + complete", "fused": "complete_and_claim(10)"}
BENIGN = ()


def parse_list(v):
    out = {}
    for part in v.strip("[]").split(","):
        if "=" in part:
            k, x = part.split("=", 1)
            out[k] = float(x)
    return out


def read_cells(run):
    cells = []
    with open(os.path.join(run, "cells.txt")) as f:
        for line in f:
            kv = {}
            for tok in line.split():
                k, v = tok.split("=", 1)
                kv[k] = v
            cells.append(kv)
    return cells


def meta(run):
    m = {}
    with open(os.path.join(run, "meta")) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                m.setdefault(k, [] if k.startswith("conf") else "")
                if k.startswith("conf"):
                    m[k].append(v)
                else:
                    m[k] = v
    return m


def cell_id(c):
    return "%s-%s-%s-%s" % (c["wl"], c["layout"], c["sys"], c["rep"])


def pgbench_out(path):
    txt = open(path).read()
    tx = re.search(r"number of transactions actually processed: (\d+)", txt)
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", txt)
    return (int(tx.group(1)) if tx else 0, float(tps.group(1)) if tps else 0.0)


def errors_of(path):
    bad = []
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        bad.append(line)
    return bad


def figures(run, c):
    """one cell's figures (a dict)"""
    d = os.path.join(run, "cells", cell_id(c))
    procs = int(c["procs"])
    per = int(c["per"])
    batch = 10
    r = {"sys": c["sys"], "wl": c["wl"], "layout": c["layout"], "rep": int(c["rep"]),
         "clients": procs * per}
    jobs = 0
    jobs_s = 0.0
    cycles_s = 0.0
    expected = 0
    errs = []
    ready_min = None
    client_cpu = 0.0
    lat = []
    for k in range(procs):
        done = int(c["done1_%d" % k]) - int(c["done0_%d" % k])
        tx, tps = pgbench_out(os.path.join(d, "pgb%d.out" % k))
        jobs += done
        if tx:
            jobs_s += done * tps / tx
        cycles_s += tps
        expected += batch * (tx - per if c["wl"] == "fused" else tx)
        ready = int(c["ready1_%d" % k])
        ready_min = ready if ready_min is None else min(ready_min, ready)
        errs += errors_of(os.path.join(d, "pgb%d.err" % k))
        if c["rc%d" % k] != "0":
            errs.append("pgbench %d exit %s" % (k, c["rc%d" % k]))
        try:
            u, s = open(os.path.join(d, "pgb%d.time" % k)).read().split()[:2]
            client_cpu += float(u) + float(s)
        except (OSError, ValueError):
            pass
        for lf in glob.glob(os.path.join(d, "pgb%d.*" % k)):
            if lf.endswith((".out", ".err", ".time")):
                continue
            with open(lf) as f:
                for line in f:
                    p = line.split()
                    if len(p) >= 3 and p[2].isdigit():
                        lat.append(int(p[2]) / 1000.0)
    cpu0, cpu1 = parse_list(c["cpu0"]), parse_list(c["cpu1"])
    nodes = ["s"] if c["sys"] == "single" else ["c", "w1", "w2"]
    us = 1e6 / HZ
    per_node = {n: (cpu1[n] - cpu0[n]) * us for n in ("s", "c", "w1", "w2") if n in cpu0}
    server = sum(per_node[n] for n in nodes)
    window = float(c["t1"]) - float(c["t0"])
    machine = (cpu1["machine"] - cpu0["machine"]) * us
    other = machine - sum(per_node.values()) - client_cpu * 1e6
    wal0, wal1 = parse_list(c["wal0"]), parse_list(c["wal1"])
    wal = sum(wal1[n] - wal0[n] for n in nodes)
    lat.sort()
    r.update({
        "jobs": jobs, "jobs_s": jobs_s, "cycles_s": cycles_s, "window": window,
        "short": expected - jobs, "ready_min": ready_min, "errors": errs,
        "cpu_job": server / jobs if jobs else float("nan"),
        "cpu_node": {n: per_node[n] / jobs if jobs else float("nan") for n in nodes},
        "client_job": client_cpu * 1e6 / jobs if jobs else float("nan"),
        "server_util": server / (window * 1e6),
        "other_pct": 100.0 * other / (window * 1e6 * CORES),
        "wal_job": wal / jobs if jobs else float("nan"),
        "lat_avg": statistics.fmean(lat) if lat else float("nan"),
        "lat_p50": lat[len(lat) // 2] if lat else float("nan"),
        "lat_p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
    })
    return r


def n0(x):
    return "{:,.0f}".format(x)


def ms(x):
    return "%.2f" % x if x < 10 else "%.1f" % x


def node_split(f):
    if f["sys"] == "single":
        return "–"
    return " / ".join("%.0f" % f["cpu_node"][n] for n in ("c", "w1", "w2"))


def line(run, cid):
    for c in read_cells(run):
        if cell_id(c) == cid:
            f = figures(run, c)
            s = ("%s jobs/s, %s cycles/s, latency avg %s p99 %s ms, server CPU %.1f us/job (%s), "
                 "client %.1f us/job, short %d, ready left %s, other load %.0f%%"
                 % (n0(f["jobs_s"]), n0(f["cycles_s"]), ms(f["lat_avg"]), ms(f["lat_p99"]),
                    f["cpu_job"], "c/w1/w2 " + node_split(f) if f["sys"] != "single" else "single",
                    f["client_job"], f["short"], n0(f["ready_min"]), f["other_pct"]))
            if f["errors"]:
                s += "; ERRORS: " + " | ".join(f["errors"][:3])
            return s
    return "no such cell"


def med(fs, key):
    return statistics.median(f[key] for f in fs)


def report(run, out):
    m = meta(run)
    cells = [figures(run, c) for c in read_cells(run)]
    groups = {}
    for f in cells:
        groups.setdefault((f["wl"], f["layout"], f["sys"]), []).append(f)
    reps = max(f["rep"] for f in cells)
    order = [(wl, lay, s) for wl in ("plain", "fused") for lay in ("one", "spread")
             for s in ("single", "direct", "coord")]
    M = {}
    for key in order:
        fs = groups.get(key)
        if not fs:
            continue
        g = {k: med(fs, k) for k in ("jobs_s", "cycles_s", "cpu_job", "client_job", "wal_job",
                                      "lat_avg", "lat_p50", "lat_p99", "other_pct", "server_util")}
        g["cpu_node"] = {n: statistics.median(f["cpu_node"][n] for f in fs) for n in fs[0]["cpu_node"]}
        g["min"] = min(f["jobs_s"] for f in fs)
        g["max"] = max(f["jobs_s"] for f in fs)
        g["short"] = sum(f["short"] for f in fs)
        g["ready_min"] = min(f["ready_min"] for f in fs)
        g["errors"] = [e for f in fs for e in f["errors"]]
        g["sys"] = key[2]
        g["clients"] = fs[0]["clients"]
        M[key] = g

    L = []
    L.append("# bench/citus %s" % m.get("stamp", ""))
    L.append("")
    L.append("pgjq on one server against pgjq on a Citus cluster (coordinator + 2 workers) on the same "
             "machine, in one run (docs/benchmarks.md, \"Citus: direct, through the coordinator, one server\").")
    L.append("")
    L.append("- command: `PGBIN=%s %s`, %s s in all" % (m.get("pgbin"), m.get("command", "").strip(), m.get("duration_s", "?")))
    L.append("- machine: %s, %s cores, %s GiB RAM, %s, kernel %s; load average at the start %s"
             % (m.get("cpu"), m.get("cores"), m.get("ram_gib"), m.get("os"), m.get("kernel"), m.get("load_at_start")))
    L.append("- PostgreSQL %s, pgjq %s (commit %s%s), Citus %s, %s"
             % (m.get("server_version"), m.get("pgjq_version"), m.get("git_commit"),
                ", src/sql modified" if m.get("git_dirty", "0") != "0" else "", m.get("citus_version"), m.get("pgbench")))
    if m.get("citus_build"):
        L.append("- Citus: " + m["citus_build"])
    L.append("- every server: " + "; ".join(m.get("conf", [])))
    L.append("- single: " + "; ".join(m.get("conf_single", [])) + "; Citus nodes: " + "; ".join(m.get("conf_citus", [])))
    L.append("- %s; %s" % (m.get("queues"), m.get("ports")))
    L.append("- each cell: %s s of `pgbench -n -M prepared -c %s -j 2 -T %s` over TCP to 127.0.0.1 (spread: two pgbench "
             "processes of %d clients, `-j 2`), batch %s; before it the queue(s) topped up to %s ready jobs "
             "(`enqueue_many`, 10,000 per transaction, on the owner), `VACUUM (ANALYZE)` of pgjq's tables and "
             "`CHECKPOINT` on every server of the system; %s repetition(s), median shown"
             % (m.get("secs"), m.get("clients"), m.get("secs"), int(m.get("clients", 8)) // 2,
                m.get("batch"), n0(int(m.get("fill", 0))), reps))
    L.append("- scripts: single and direct `bench/scripts/drain.sql` (claim, then `complete(ids, tokens)`), coord "
             "`bench/scripts/drain_in.sql` (claim, then `complete_in(queue, ids, tokens)`); fused: "
             "`bench/scripts/cycle.sql` (`complete_and_claim(queue, ids, tokens, 10)`) for all three")
    L.append("")
    L.append("Server CPU: utime + stime of every process of the system's postmasters (the single server; or "
             "coordinator + both workers), read from /proc before and after the window (exited backends through "
             "the postmaster's cutime + cstime), divided by the jobs completed; split c / w1 / w2 for Citus. "
             "Client CPU: pgbench's. Other load: the machine's busy CPU not ours (the idle servers, and whatever "
             "else runs on the machine), in %% of all %s cores. Latency: per pgbench transaction (plain: the claim "
             "or the complete, each its own transaction; fused: one cycle). Short: jobs a full batch per cycle "
             "would have completed minus jobs completed (0 = no empty or partial claim); ready left: the fewest "
             "ready jobs in a queue after the window." % m.get("cores"))
    L.append("")
    hdr = ("| workload | layout | system | clients | jobs/s | min–max | cycles/s | latency avg / p99 ms | "
           "server CPU µs/job | c / w1 / w2 µs/job | client CPU µs/job | WAL B/job | short | ready left | other load |")
    L.append(hdr)
    L.append("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for key in order:
        g = M.get(key)
        if not g:
            continue
        wl, lay, s = key
        L.append("| %s | %s | %s | %s | %s | %s–%s | %s | %s / %s | %.1f | %s | %.1f | %.0f | %d | %s | %.0f%% |"
                 % (WL_NAME[wl], "1 queue, worker 1" if (lay == "one" and s != "single") else
                    ("1 queue" if lay == "one" else ("2 queues, 1 per worker" if s != "single" else "2 queues")),
                    s, g["clients"], n0(g["jobs_s"]), n0(g["min"]), n0(g["max"]), n0(g["cycles_s"]),
                    ms(g["lat_avg"]), ms(g["lat_p99"]), g["cpu_job"], node_split(g), g["client_job"],
                    g["wal_job"], g["short"], n0(g["ready_min"]), g["other_pct"]))
    errs = [(k, e) for k, g in M.items() for e in g["errors"]]
    L.append("")
    if errs:
        L.append("**Errors** (pgbench's stderr):")
        L.append("")
        for k, e in errs[:20]:
            L.append("- %s: `%s`" % ("/".join(k), e))
    else:
        L.append("No errors (no pgbench client aborted; no SQLSTATE PJ001 or any other error).")
    shorts = sum(g["short"] for g in M.values())
    dry = [k for k, g in M.items() if g["ready_min"] == 0]
    L.append("Empty or partial claims: %s; queues that ran dry: %s."
             % ("none" if shorts == 0 else "%d jobs short in all" % shorts,
                "none" if not dry else ", ".join("/".join(k) for k in dry)))
    L.append("")

    # comparisons
    L.append("## Comparisons (medians)")
    L.append("")
    for wl in ("plain", "fused"):
        s1, d1, c1 = (M.get((wl, "one", x)) for x in ("single", "direct", "coord"))
        ds, cs, ss = (M.get((wl, "spread", x)) for x in ("direct", "coord", "single"))
        if not (s1 and d1 and c1):
            continue
        L.append("%s, 8 clients on one queue:" % WL_NAME[wl])
        L.append("")
        L.append("- direct / single: %.2f× the jobs/s, %+.1f µs server CPU per job (%.1f vs %.1f): what Citus "
                 "being loaded costs a worker that serves its own queue, plus the idle coordinator and other worker"
                 % (d1["jobs_s"] / s1["jobs_s"], d1["cpu_job"] - s1["cpu_job"], d1["cpu_job"], s1["cpu_job"]))
        L.append("- coord / direct: %.2f× the jobs/s; %+.1f µs server CPU per job (%.1f vs %.1f), of which the "
                 "coordinator %+.1f and worker 1 %+.1f; latency avg %s vs %s ms"
                 % (c1["jobs_s"] / d1["jobs_s"], c1["cpu_job"] - d1["cpu_job"], c1["cpu_job"], d1["cpu_job"],
                    c1["cpu_node"]["c"] - d1["cpu_node"]["c"], c1["cpu_node"]["w1"] - d1["cpu_node"]["w1"],
                    ms(c1["lat_avg"]), ms(d1["lat_avg"])))
        if ds and cs:
            L.append("- spread over both workers (4 + 4 clients) / one worker: direct %.2f×, coord %.2f× the jobs/s%s"
                     % (ds["jobs_s"] / d1["jobs_s"], cs["jobs_s"] / c1["jobs_s"],
                        ("; single server with 2 queues %.2f×" % (ss["jobs_s"] / s1["jobs_s"])) if ss else ""))
        L.append("")

    # more cores
    L.append("## What a machine with more cores should show")
    L.append("")
    L.append("On this machine every figure is bounded by its %s cores, which the servers and pgbench share "
             "(server CPU in use during the windows: %s cores of %s on average). So jobs/s here mostly measure CPU "
             "per job; with more cores, or one machine per node, the ceiling of each system is its CPU per job on "
             "its busiest node, as long as clients and locks keep up (per core: 10⁶ / µs per job):"
             % (m.get("cores"), "%.1f" % statistics.median(g["server_util"] for g in M.values()), m.get("cores")))
    L.append("")
    for wl in ("plain", "fused"):
        s1, d1, c1 = (M.get((wl, "one", x)) for x in ("single", "direct", "coord"))
        if not (s1 and d1 and c1):
            continue
        # statements per job: plain 2 per cycle of 10, fused 1
        st = (2.0 if wl == "plain" else 1.0) / 10
        wdir = d1["cpu_node"]["w1"]
        wco = c1["cpu_node"]["w1"]
        cco = c1["cpu_node"]["c"]
        L.append("- %s: a single server %.1f µs/job, %s jobs/s per core; a Citus worker with direct clients "
                 "%.1f µs/job (%+.1f over single, %+.0f µs per statement), %s jobs/s per core; through the coordinator the "
                 "worker %.1f µs/job (%+.1f over direct, %+.0f µs per delegated statement), %s jobs/s per core, "
                 "and the coordinator %.1f µs/job (%.0f µs per statement it forwards), %s jobs/s per core: one "
                 "coordinator core keeps about %.1f worker cores busy. In all, through the coordinator costs "
                 "%.1f µs of server CPU per job more than direct (%.2f× direct's)"
                 % (WL_NAME[wl], s1["cpu_job"], n0(1e6 / s1["cpu_job"]),
                    wdir, wdir - s1["cpu_job"], (wdir - s1["cpu_job"]) / st, n0(1e6 / wdir),
                    wco, wco - wdir, (wco - wdir) / st, n0(1e6 / wco),
                    cco, cco / st, n0(1e6 / cco) if cco else "–", wco / cco if cco else float("nan"),
                    c1["cpu_job"] - d1["cpu_job"], c1["cpu_job"] / d1["cpu_job"]))
    L.append("")
    L.append("With the nodes on separate machines, what the coordinator's hop costs changes shape: its CPU "
             "(above) moves to the coordinator's own machine, the worker keeps only its own extra, and every "
             "statement pays one more network round trip (coordinator to worker) than a direct client's: two per "
             "plain cycle, one per fused cycle. A client's cycle gets longer by those round trips, so the same "
             "jobs/s needs proportionally more clients (Little's law: clients = cycles/s × cycle time); the "
             "workers' ceiling is then their own CPU per job. Spread over two workers, jobs/s should add up per "
             "worker once each worker has its own cores (here all servers share %s)." % m.get("cores"))
    L.append("")
    text = "\n".join(L) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "line":
        print(line(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "report" and sys.argv[3] == "--out":
        report(sys.argv[2], sys.argv[4])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
