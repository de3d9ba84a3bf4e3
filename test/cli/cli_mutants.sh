#!/usr/bin/env bash
# Every planted bug of test/tools/mutants.txt still applies to the tree: its snippet is found exactly
# once in its file. Cheap (no build); the full harness, which builds and runs each mutant, is
# `make mutants` (.ci/run runs a selection of them after make test: test/tools/mutants.py --ci).
cd "$(dirname "$0")/../.." && python3 test/tools/mutants.py --check
