#!/usr/bin/env python3
"""Mutation testing: plants each bug of test/tools/mutants.txt, one at a time, into a scratch copy of the
tree, rebuilds it and runs the test command that must catch it (`make mutants`).

  python3 test/tools/mutants.py [--only NAME]... [--ci [N]] [--list] [--check] [--dir DIR]

First every mutant's piece of code must occur exactly once in its file (a mutant that no longer
applies is reported, not skipped; --check stops there, as make test does). The scratch tree
(DIR, default /tmp/cooktrain-mutants) gets a copy of every tracked file and is built once; every distinct test command then runs on the
unmutated tree and must pass — otherwise a "caught" would mean nothing. Then, per mutant: apply,
rebuild (incrementally), run the command; the mutant is caught when the command fails. Prints
"caught NAME" or "MISSED NAME" per mutant and "mutants: N caught, M missed", and exits 1 unless
every mutant was caught.

--ci (what .ci/run uses; `make mutants` runs them all): the mutants of the files that commits of
the 4 hours before HEAD's own commit time touched (a working session's change), at most
CI_TOUCHED_MAX of them (a long session touches many files; past the cap, a sample drawn as below),
plus a rotating sample of N of the others (default 15), drawn with HEAD's commit id as the seed,
so every CI run checks what just changed and, over a few runs, the rest, and the mutants stage
stays near 15 minutes on 2 cores (a baseline pass of their test commands, ~5 minutes, then ~14 s
a mutant: 70 took 21 minutes on 2026-12-02). Prints which it chose.
"""
import glob
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT = 900
CI_TOUCHED_MAX = 30


def parse(path):
    mutants, cur, section = [], None, None
    for raw in open(path):
        line = raw.rstrip("\n")
        if line.startswith("=== "):
            cur = {"name": line[4:].strip(), "find": [], "replace": []}
            mutants.append(cur)
            section = None
        elif cur is None or (section is None and line.startswith("#")):
            continue
        elif line == "--- find":
            section = "find"
        elif line == "+++ replace":
            section = "replace"
        elif section:
            cur[section].append(line)
        elif ":" in line:
            key, value = line.split(":", 1)
            cur[key.strip()] = value.strip()
    for m in mutants:
        while m["replace"] and not m["replace"][-1].strip():
            m["replace"].pop()
        while m["find"] and not m["find"][-1].strip():
            m["find"].pop()
        m["find"] = "\n".join(m["find"])
        m["replace"] = "\n".join(m["replace"])
        for key in ("what", "file", "test"):
            if not m.get(key):
                sys.exit("mutants.txt: %s has no '%s:' line" % (m["name"], key))
    return mutants


def run(cmd, cwd, log):
    with open(log, "w") as out:
        try:
            return subprocess.run(cmd, shell=True, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT, executable="/bin/bash").returncode
        except subprocess.TimeoutExpired:
            return 124


def ci_selection(mutants, n_sample):
    """The files touched within 4 hours before HEAD's commit, their mutants, and a sample of the
    rest seeded by HEAD's commit id."""
    git = lambda *a: subprocess.run(["git"] + list(a), cwd=ROOT, capture_output=True,
                                    check=True).stdout.decode()
    head, stamp = git("log", "-1", "--format=%H %ct").split()
    since = int(stamp) - 4 * 3600
    touched = set(f for f in git("log", "--since=@%d" % since, "--name-only", "--format=").split())
    mine = [m for m in mutants if m["file"] in touched]
    rest = [m for m in mutants if m["file"] not in touched]
    rng = random.Random(int(head, 16))
    n_mine = len(mine)
    if n_mine > CI_TOUCHED_MAX:
        mine = rng.sample(mine, CI_TOUCHED_MAX)
    sample = rng.sample(rest, min(n_sample, len(rest)))
    chosen = set(m["name"] for m in mine + sample)
    print("ci: %d of the %d mutants of %d files touched in the 4 hours before %s, %d more of %d "
          "drawn with it as the seed (make mutants runs all %d)" %
          (len(mine), n_mine, len(touched), head[:12], len(sample), len(rest), len(mutants)))
    return [m for m in mutants if m["name"] in chosen]


def main(argv):
    only = [argv[i + 1] for i, a in enumerate(argv) if a == "--only"]
    work = argv[argv.index("--dir") + 1] if "--dir" in argv else "/tmp/cooktrain-mutants"
    mutants = parse(os.path.join(HERE, "mutants.txt"))
    if only:
        mutants = [m for m in mutants if m["name"] in only]
    if "--ci" in argv:
        i = argv.index("--ci")
        n = int(argv[i + 1]) if i + 1 < len(argv) and argv[i + 1].isdigit() else 15
        if "--check" not in argv:
            mutants = ci_selection(mutants, n)
    if "--list" in argv:
        for m in mutants:
            print("%-40s %s" % (m["name"], m["what"]))
        return 0

    stale = []
    for m in mutants:
        text = open(os.path.join(ROOT, m["file"])).read()
        if text.count(m["find"]) != 1:
            stale.append("%s (%s: found %d times)" % (m["name"], m["file"], text.count(m["find"])))
    if "--check" in argv:
        # make test's quick guard (test/cli/cli_mutants.sh): every planted bug still finds the code
        # it changes, so a refactor cannot leave `make mutants` failing on a stale snippet.
        for m in mutants:
            bad = [s for s in stale if s.startswith(m["name"] + " ")]
            print(("FAIL mutant %s no longer applies: %s" % (m["name"], bad[0])) if bad
                  else "ok mutant %s applies" % m["name"])
        return 1 if stale else 0
    if stale:
        print("mutants that no longer apply: " + "; ".join(stale))
        return 1

    # The scratch tree: the tracked files, built once.
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    # What the scratch tree held: a source whose bytes differ now (a mutant an interrupted run
    # left in place, or an edit) gets a new mtime below, so make rebuilds what it compiled into.
    before = {}
    for f in files:
        if f and os.path.isfile(os.path.join(work, f)):
            before[f] = open(os.path.join(work, f), "rb").read()
    if os.path.isdir(work):
        for entry in os.listdir(work):
            if entry != "build":  # keep the objects: the next build is incremental
                path = os.path.join(work, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(work, exist_ok=True)
    for f in files:
        if f:
            os.makedirs(os.path.join(work, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(work, f))
            if before.get(f) != open(os.path.join(work, f), "rb").read():
                os.utime(os.path.join(work, f))
    # The Makefile marks every target .SECONDARY, so an object missing for a source file new
    # since the last run (copied with its old mtime) would not be rebuilt for an archive that
    # looks up to date: remove the archives, so they are remade from every object.
    for lib in glob.glob(os.path.join(work, "build", "*.a")):
        os.remove(lib)
    logs = os.path.join(work, "mutant-logs")
    os.makedirs(logs, exist_ok=True)
    make = "make --no-print-directory -j2 all >/dev/null"
    if run(make, work, os.path.join(logs, "build.log")) != 0:
        # The kept objects' dependency files may name a source that has since moved (make then
        # finds no rule for it): build once more from nothing before calling the tree broken.
        shutil.rmtree(os.path.join(work, "build"), ignore_errors=True)
        if run(make, work, os.path.join(logs, "build.log")) != 0:
            print("FAIL the scratch tree does not build (see %s/build.log)" % logs)
            return 1

    t0 = time.time()
    commands = sorted(set(m["test"] for m in mutants))
    for i, cmd in enumerate(commands):
        if run(cmd, work, os.path.join(logs, "baseline-%d.log" % i)) != 0:
            print("FAIL baseline: `%s` fails without any mutant (see %s/baseline-%d.log)" %
                  (cmd, logs, i))
            return 1
    print("baseline: %d test commands pass on the unmutated tree (%.0f s)" %
          (len(commands), time.time() - t0), flush=True)

    caught = missed = 0
    for m in mutants:
        path = os.path.join(work, m["file"])
        original = open(path).read()
        open(path, "w").write(original.replace(m["find"], m["replace"]))
        log = os.path.join(logs, m["name"] + ".log")
        t0 = time.time()
        if run(make, work, log) != 0:
            status = "did not build"
            rc = None
        else:
            rc = run(m["test"], work, log)
            status = None
        open(path, "w").write(original)
        if status:
            print("ERROR %s: the mutant %s (see %s)" % (m["name"], status, log), flush=True)
            missed += 1
        elif rc != 0:
            caught += 1
            print("caught %-38s %s — by `%s` (%.0f s)" % (m["name"], m["what"], m["test"],
                                                         time.time() - t0), flush=True)
        else:
            missed += 1
            print("MISSED %-38s %s — `%s` passed (see %s)" % (m["name"], m["what"], m["test"], log),
                  flush=True)
    run(make, work, os.path.join(logs, "restore.log"))
    print("mutants: %d caught, %d missed (of %d)" % (caught, missed, len(mutants)))
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
