#!/usr/bin/env python3
"""bench/spike/report.py TSV STAMP LOAD_START LOAD_END SERVER MACHINE SIZES:
the markdown tables of a bench/spike/run (medians over the repetitions)."""
import csv
import statistics
import sys

tsv, stamp, load0, load1, server, machine, sizes = sys.argv[1:8]
rows = list(csv.DictReader(open(tsv), delimiter='\t'))
NUM = ['jobs', 'secs', 'jobs_s', 'wal_job', 'commits_job', 'upd_job', 'del_job', 'dead_job',
       'wal_sync_job', 'wal_write_job', 'srv_us_job', 'cli_us_job', 'other_cores']
groups = {}
for r in rows:
    groups.setdefault((r['scenario'], r['system'], r['part']), []).append(r)


def med(key, col):
    v = [float(r[col]) for r in groups.get(key, [])]
    return statistics.median(v) if v else None


def rng(key, col):
    v = [float(r[col]) for r in groups.get(key, [])]
    return (min(v), max(v)) if v else (None, None)


def f(x, d=0):
    if x is None:
        return '-'
    return f'{x:,.{d}f}'


out = []
p = out.append
p(f'# bench/spike/run {stamp}')
p('')
p(f'- server: {server}; {machine}')
p(f'- sizes: {sizes}')
p(f'- machine load at start: `{load0.strip()}`')
p(f'- machine load at end: `{load1.strip()}`')
p('')
p('## Sustained (8 clients, -M prepared): medians, min-max of jobs/s')
p('')
p('| scenario | system | jobs/s | min-max | spike/baseline | tx/s | WAL B/job | commits/job | upd/job | del/job | dead growth/job | wal_sync/job | wal_write/job | server CPU us/job | pgbench CPU us/job | other sessions (cores) |')
p('|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|')
for scn in ('D2', 'D3', 'H1', 'D2N'):
    for sysname in ('spike', 'baseline'):
        k = (scn, sysname, 'all')
        if k not in groups:
            continue
        lo, hi = rng(k, 'jobs_s')
        ratio = ''
        if sysname == 'spike' and (scn, 'baseline', 'all') in groups:
            ratio = f"{med(k, 'jobs_s') / med((scn, 'baseline', 'all'), 'jobs_s'):.2f}x"
        p(f"| {scn} | {sysname} | {f(med(k, 'jobs_s'))} | {f(lo)}-{f(hi)} | {ratio} | {f(med(k, 'jobs_s') * med(k, 'commits_job'))} | {f(med(k, 'wal_job'))} | "
          f"{f(med(k, 'commits_job'), 3)} | {f(med(k, 'upd_job'), 2)} | {f(med(k, 'del_job'), 2)} | "
          f"{f(med(k, 'dead_job'), 3)} | {f(med(k, 'wal_sync_job'), 3)} | {f(med(k, 'wal_write_job'), 3)} | "
          f"{f(med(k, 'srv_us_job'))} | {f(med(k, 'cli_us_job'))} | {f(med(k, 'other_cores'), 2)} |")
p('')
k = ('CEIL', 'commit', 'all')
if k in groups:
    lo, hi = rng(k, 'jobs_s')
    p(f"- commit ceiling (CEIL: 8 clients, one-row INSERT transactions): {f(med(k, 'jobs_s'))} tx/s "
      f"({f(lo)}-{f(hi)}), wal_sync per commit {f(med(k, 'wal_sync_job'), 3)}, "
      f"server CPU {f(med(k, 'srv_us_job'))} us/tx, pgbench {f(med(k, 'cli_us_job'))} us/tx")
for sysname in ('spike', 'baseline'):
    d2, h1 = med(('D2', sysname, 'all'), 'jobs_s'), med(('H1', sysname, 'all'), 'jobs_s')
    if d2 and h1:
        p(f'- H1/D2 {sysname}: {h1 / d2:.2f}')
p('')
p('## Whole life of 10,000 jobs: medians per job')
p('')
p('LB: enqueue_many(10,000) in one transaction; LS: 10,000 enqueue transactions (4 clients); '
  'then both drained by claim(10) + complete in two transactions (2 clients).')
p('')
p('| scenario | system | part | WAL B/job | commits/job | upd/job | del/job | dead growth/job | wal_sync/job | server CPU us/job | pgbench CPU us/job |')
p('|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|')
for scn in ('LB', 'LS'):
    for sysname in ('spike', 'spike-noidx', 'baseline'):
        for part in ('enqueue', 'drain', 'all'):
            k = (scn, sysname, part)
            if k not in groups:
                continue
            wal = f(med(k, 'wal_job'))
            if part == 'all':
                wal = f'**{wal}**'
            p(f"| {scn} | {sysname} | {part} | {wal} | {f(med(k, 'commits_job'), 3)} | "
              f"{f(med(k, 'upd_job'), 2)} | {f(med(k, 'del_job'), 2)} | {f(med(k, 'dead_job'), 3)} | "
              f"{f(med(k, 'wal_sync_job'), 3)} | {f(med(k, 'srv_us_job'))} | {f(med(k, 'cli_us_job'))} |")
p('')
p('## Against the issue 7 targets')
p('')


def verdict(ok):
    return 'met' if ok else '**not met**'


def ratio(scn):
    a, b = med((scn, 'spike', 'all'), 'jobs_s'), med((scn, 'baseline', 'all'), 'jobs_s')
    return a / b if a and b else None


r = ratio('D2')
if r:
    p(f'- D2 jobs/s vs baseline: {r:.2f}x (>= 2.5x: {verdict(r >= 2.5)}; stretch 4x)')
r = ratio('D3')
if r:
    p(f'- D3 jobs/s vs baseline: {r:.2f}x (>= 3x: {verdict(r >= 3)}; stretch 5x)')
c = med(('D3', 'spike', 'all'), 'commits_job')
if c is not None:
    p(f'- D3 commits/job: {c:.3f} (<= 0.11: {verdict(c <= 0.11)})')
w = med(('LB', 'spike', 'all'), 'wal_job')
if w:
    p(f'- WAL/job whole life, batched: {w:.0f} B (<= 330: {verdict(w <= 330)}; stretch 290)')
w = med(('LS', 'spike', 'all'), 'wal_job')
if w:
    p(f'- WAL/job whole life, one enqueue per transaction: {w:.0f} B (<= 420: {verdict(w <= 420)}; stretch 380)')
dead = [med((s, 'spike', 'all'), k) for s in ('D2', 'D3', 'H1') for k in ('upd_job', 'del_job', 'dead_job')]
dead = [x for x in dead if x is not None]
if dead:
    p(f'- dead tuples/job on the spike tables (upd, del, n_dead_tup growth; D2, D3, H1): max {max(dead):.3f} (<= 0.05: {verdict(max(dead) <= 0.05)})')
d2, h1 = med(('D2', 'spike', 'all'), 'jobs_s'), med(('H1', 'spike', 'all'), 'jobs_s')
if d2 and h1:
    p(f'- H1/D2 spike: {h1 / d2:.2f} (>= 0.9: {verdict(h1 / d2 >= 0.9)})')
p('')
p('## Every window')
p('')
cols = ['scenario', 'system', 'rep', 'part'] + NUM
p('| ' + ' | '.join(cols) + ' |')
p('|' + '---|' * len(cols))
for r in rows:
    p('| ' + ' | '.join(r[c] for c in cols) + ' |')
print('\n'.join(out))
