#!/usr/bin/env python3
"""Where a shell suite spends its time, from the file CT_TIMES=FILE made (test/tools/lib_cli.sh):

    CT_TIMES=/tmp/t bash test/run_tests.sh cli_mpi_dp; python3 test/tools/check_times.py /tmp/t [N]

prints the N (default 20) checks that took longest, each with the seconds since the check before
it (the first check's time counts from the run's start, which the file does not know: 0)."""
import sys

rows = []
for line in open(sys.argv[1]):
    t, _, what = line.rstrip("\n").partition(" ")
    rows.append((float(t), what))
rows.sort(key=lambda r: r[0])
spans = [(b[0] - a[0], b[1]) for a, b in zip(rows, rows[1:])]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
total = rows[-1][0] - rows[0][0] if rows else 0.0
print(f"{len(rows)} checks over {total:.0f} s")
for secs, what in sorted(spans, reverse=True)[:top]:
    print(f"{secs:8.1f}  {what[:110]}")
