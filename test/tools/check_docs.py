#!/usr/bin/env python3
"""Checks that what the READMEs state and a program can check is still true.

    python3 test/tools/check_docs.py [--binary build/cooktrain] [--extra-file PATH]...

Each failing rule prints one line "FAIL <rule>: <what>"; each passing rule "ok <rule>"; the exit
status is 1 when any rule failed. The rules:

  files       every tracked source file is named, in a table row, in the README.md of the nearest
              folder above it that has one (its file name, its stem, its path from that folder,
              or a brace form such as `comm_mpi.{h,c}` or `config_{keys,load}.c`); a folder directly under the root needs
              a README.md of its own. Data folders (bad_configs, fuzz regressions) are left out.
  commands    the subcommands in README.md's "## Commands" table are those `cooktrain --help`
              lists, no more and no fewer.
  packages    the packages README.md's "Packages:" paragraph names are those scripts/setup.sh
              installs, no more and no fewer.
  length      README.md and cuda/README.md hold at most 250 lines each.
  citations   no tracked file cites an issue number, the style or design card, or the folder
              beside the checkout those came from: a user's clone has none of them.

--extra-file PATH counts PATH as tracked (test/cli/cli_docs.sh plants an undocumented file this
way to see the rule fail).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_EXT = {".c", ".h", ".cu", ".cuh", ".cc", ".py", ".sh", ".mk", ".sbatch", ".yaml"}
DATA_DIRS = ("test/cli/bad_configs/", "test/fuzz/regressions/")
MAX_LINES = {"README.md": 250, "cuda/README.md": 250}
# Built so that this file does not match its own patterns.
CITATIONS = [
    (re.compile(r"\bissue [0-9]+\b"), "an issue number"),
    (re.compile(r"\bSTYLE\.md\b|\bSTYLE \u00a7"), "the style card"),
    (re.compile(r"\bDESIGN\.md\b|\bDESIGN \u00a7"), "the design card"),
    (re.compile(r"\.\./shared\b"), "the folder beside the checkout"),
]

failures = 0


def report(rule, problems):
    global failures
    if problems:
        failures += 1
        for p in problems:
            print(f"FAIL {rule}: {p}")
    else:
        print(f"ok {rule}")


def tracked_files(extra):
    """git's tracked files; outside a checkout (the mutants' scratch copy of the tracked files)
    every file but the build's, the data's and the runs'."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        files = [f for f in out.stdout.splitlines() if os.path.isfile(os.path.join(ROOT, f))]
    else:
        files = []
        for d, subdirs, names in os.walk(ROOT):
            rel = os.path.relpath(d, ROOT)
            subdirs[:] = [s for s in subdirs if not s.startswith(".") and
                          not (rel == "." and (s.startswith("build") or s in ("data", "runs", "mutant-logs")))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return files + list(extra)


def expand_braces(token):
    """`a.{h,c}` -> a.h, a.c; `x_{k,l}.c` -> x_k.c, x_l.c (one or more groups)."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(token[: m.start()] + alt + token[m.end():])
    return out


def table_names(readme_path):
    """Every name a README's table rows mention in backticks, expanded, with basenames."""
    names = set()
    with open(readme_path, encoding="utf-8") as f:
        for line in f:
            if not line.lstrip().startswith("|"):
                continue
            for token in re.findall(r"`([^`]+)`", line):
                for name in expand_braces(token.strip()):
                    names.add(name)
                    names.add(name.split("/")[-1])
    return names


def check_files(files):
    problems = []
    readmes = {os.path.dirname(f) for f in files if os.path.basename(f) == "README.md"}
    cache = {}
    for f in sorted(files):
        if "/" not in f or f.startswith(DATA_DIRS) or f.startswith("."):
            continue
        if os.path.splitext(f)[1] not in SOURCE_EXT:
            continue
        folder = os.path.dirname(f)
        while folder and folder not in readmes:
            folder = os.path.dirname(folder)
        if not folder:
            top = f.split("/")[0]
            problems.append(f"{f}: {top}/ has no README.md to say what it holds")
            continue
        if folder not in cache:
            cache[folder] = table_names(os.path.join(ROOT, folder, "README.md"))
        names = cache[folder]
        rel = os.path.relpath(f, folder)
        base = os.path.basename(f)
        stem = os.path.splitext(base)[0]
        if not ({rel, base, stem} & names):
            problems.append(f"{f} is not in the file table of {folder}/README.md")
    return problems


def differences(truth, stated, missing, extra):
    """One message per name in truth but not stated (missing.format(name)), and the reverse."""
    return ([missing.format(n) for n in sorted(truth - stated)] +
            [extra.format(n) for n in sorted(stated - truth)])


def section(text, heading):
    m = re.search(r"^## " + re.escape(heading) + r"\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else None


def check_commands(binary):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    body = section(readme, "Commands")
    if body is None:
        return ["README.md has no '## Commands' section"]
    documented = set()
    for line in body.splitlines():
        m = re.match(r"\|\s*`([a-z]+)`", line)
        if m:
            documented.add(m.group(1))
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        return [f"{binary} --help exited {out.returncode}"]
    listed, inside = set(), False
    for line in out.stdout.splitlines():
        if line.strip() == "commands:":
            inside = True
        elif inside:
            m = re.match(r"  ([a-z]+)\s{2,}\S", line)
            if m:
                listed.add(m.group(1))
            elif line.strip():
                inside = False
    problems = [] if listed else [f"{binary} --help lists no commands"]
    return problems + differences(
        listed, documented, "`{}` is a command (--help) missing from README.md's Commands table",
        "README.md's Commands table names `{}`, which --help does not list")


def check_packages():
    setup = open(os.path.join(ROOT, "scripts/setup.sh"), encoding="utf-8").read()
    m = re.search(r"^packages=\((.*?)^\)", setup, re.M | re.S)
    if not m:
        return ["scripts/setup.sh has no packages=( ... ) list"]
    installed = set()
    for line in m.group(1).splitlines():
        installed.update(line.split("#")[0].split())
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    p = re.search(r"^Packages:(.*?)(?:\n\s*\n|\Z)", readme, re.M | re.S)
    if not p:
        return ["README.md has no paragraph starting 'Packages:'"]
    named = set(re.findall(r"`([a-z0-9][a-z0-9.+-]*)`", p.group(1)))
    return differences(installed, named,
                       "scripts/setup.sh installs {}, which README.md's Packages: omits",
                       "README.md's Packages: names {}, which scripts/setup.sh does not install")


def check_length():
    problems = []
    for path, limit in MAX_LINES.items():
        n = sum(1 for _ in open(os.path.join(ROOT, path), encoding="utf-8"))
        if n > limit:
            problems.append(f"{path} is {n} lines (at most {limit})")
    return problems


def check_citations(files):
    problems = []
    for f in files:
        if f.startswith("test/fuzz/regressions/") or f == "test/tools/mutants.txt":
            continue  # inputs: hostile bytes, and the planted bugs (one plants a citation)
        try:
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for pattern, what in CITATIONS:
                if pattern.search(line):
                    problems.append(f"{f}:{n} cites {what}: {line.strip()[:100]}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "cooktrain"))
    ap.add_argument("--extra-file", action="append", default=[])
    args = ap.parse_args()
    files = tracked_files(args.extra_file)
    report("files", check_files(files))
    report("commands", check_commands(args.binary))
    report("packages", check_packages())
    report("length", check_length())
    report("citations", check_citations([f for f in files if f not in args.extra_file]))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
