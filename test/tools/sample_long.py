#!/usr/bin/env python3
"""Prints N of the shell suites that have long parts (a `# long: ` header line), drawn with the
checked-out commit's id as the seed, space-separated: `make test-long SAMPLE=N` runs those, so CI
runs a different few of them each commit and a rerun of one commit the same ones."""
import glob
import os
import random
import subprocess
import sys

n = int(sys.argv[1])
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
suites = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(root, "test/*/cli_*.sh"))
                if any(l.startswith("# long: ") for l in open(p)))
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
random.Random(head or "no commit").shuffle(suites)
print(" ".join(sorted(suites[:n])))
