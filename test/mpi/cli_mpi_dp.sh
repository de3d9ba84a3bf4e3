#!/usr/bin/env bash
# Data parallelism through the real binary under mpirun (core/README.md, Determinism;
# parallel/README.md):
#   - the comparator itself: test/tools/compare_runs.py --self-test must catch planted differences;
#   - equivalence: dp x ZeRO stage x micro_batch against world size 1 on configs/test-tiny.yaml
#     (every step's loss and gradient norm, every parameter tensor: test/tools/compare_runs.py states
#     the tolerances), every dp replica bit-identical (--dump-params compares them), memory per
#     category equal to the ZeRO formula and dp traffic equal to it, exactly;
#   - parallel.bucket_mb (layers merged into bigger units) trains the same model;
#   - overlap: the trace shows reductions completing while the backward pass still runs;
#   - bad layouts and a data file present on one rank only: exit 2 on every rank, one message,
#     no hang.
# MPI tests run one at a time, one thread per rank, passive waiting (test/README.md, MPI tests).
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup

if reference_run "$tmp"; then
    python3 test/tools/compare_runs.py --self-test "$tmp/ref.jsonl" "$tmp/ref.bin" --init "$tmp/init.bin"
    # np  zero  micro_batch  extra: every stage at 2 and 8 ranks, both a full (global/dp) and a
    # smaller micro-batch, dp=4 in between; merged units (bucket_mb) at stages 0 and 3.
    while read -r np zero micro extra; do
        name="np=$np zero=$zero micro_batch=$micro $extra"
        selected "$name" || continue
        # shellcheck disable=SC2086
        if expect_exit 0 "train $name" -- "${MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" \
            --set parallel.zero_stage="$zero" --set train.micro_batch="$micro" $extra \
            --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin"; then
            expect_text "all bit-identical" "$name: every dp replica holds the same bytes"
            check_against_reference "$name" "$tmp"
            case "$extra" in *bucket_mb*)
                # the last setup line: the file is appended to, one segment a run
                units=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"setup\"" in l][-1]["units"])' "$tmp/run.jsonl")
                # 16 layers + embeddings + head make 18 units unmerged
                if [ "$units" -lt 18 ]; then ok "$name: layers merged into $units units"; else fail "$name: layers merged ($units units)"; fi ;;
            esac
        fi
    done <<'RUNS'
2 0 8
2 1 2
2 2 8
2 2 2
2 3 2
4 0 1
4 1 4
4 2 2
4 3 4
8 0 2
8 1 1
8 2 2
8 3 1
8 3 2
2 0 2 --set parallel.bucket_mb=0.5
4 3 2 --set parallel.bucket_mb=100
RUNS
fi

# Overlap: some unit's reduction is seen complete while the backward pass of the last
# microbatch still runs (test/tools/check_overlap.py says why either rank may show it).
if expect_exit 0 "train with a trace" -- "${MPIRUN[@]}" -np 2 "$BIN" "${base[@]}" --set train.steps=1 \
    --set train.warmup_steps=1 --set log.trace="$tmp/trace.json"; then
    if out=$(python3 test/tools/check_overlap.py "$tmp/trace.rank0.json" "$tmp/trace.rank1.json"); then
        ok "reductions complete while backward runs (trace: $out)"
    else
        fail "reductions complete while backward runs (trace: $out)"
    fi
fi

# Bad layouts: the same message on rank 0, exit 2 from every rank, no hang.
expect_exit 2 "grid does not match the world size" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set parallel.dp=3
expect_text "hint:" "grid mismatch has a hint"
n=$(printf '%s\n' "$OUT_TEXT" | grep -c '^cooktrain:')
if [ "$n" = 1 ]; then ok "grid mismatch printed once (rank 0)"; else fail "grid mismatch printed $n times"; fi
expect_exit 2 "global batch not divisible by micro_batch x dp" -- "${MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" --set train.micro_batch=8
expect_text "global_batch" "indivisible batch names train.global_batch"

# A data file present on rank 0 only: each rank runs in its own directory and the path is
# relative, so rank 1 cannot open it. Both must stop with exit 2.
mkdir -p "$tmp/rank0" "$tmp/rank1"
cp "$TEST_DATA/train.bin" "$tmp/rank0/train.bin"
rank_dirs_command "$tmp"
expect_exit 2 "data file missing on one rank" -- "${RANK_CMD[@]}"
expect_text "rank 1" "the failing rank is named"
expect_text "train.bin" "the missing file is named"
