#!/usr/bin/env bash
# SLURM for real (core/README.md, Checkpoints): a private one-node cluster (test/mpi/slurm_cluster.sh)
# runs the CPU batch script scripts/slurm/cooktrain.sbatch on configs/test-tiny.yaml, two ranks
# started by srun through PMIx (no mpirun):
#   - sbatch: the job completes (exit 0), its log, metrics and checkpoints land in its per-job
#     directories;
#   - preemption: a running job signalled with `scancel --signal=USR1 --batch` saves at the next
#     step boundary, exits 0 and requeues itself; the requeued run appends to the job's metrics
#     (every step once, two segments) and resumes (checkpoint.resume:
#     auto) and finishes with losses and parameters bit-identical to an uninterrupted run;
#   - cancelled and time limit: a job cancelled mid-run, or killed at its time limit (both
#     SIGTERM, SIGKILL 2 s later), leaves only complete checkpoints (each verifies with
#     `cooktrain inspect`, `latest` names the newest), and the next submission given its
#     checkpoint directory resumes from the newest;
#   - a rank killed with SIGKILL: the job ends (no hang), and the next submission resumes;
#   - local checkpoints every step, a rank killed with SIGKILL, the job requeued (scontrol
#     requeue): the requeued run gathers the newest local step, bit-identical to an uninterrupted
#     run;
#   - scaling sweeps as a job array (scripts/bench_scaling.sh --slurm): one task per run, the
#     table job after them; a cancelled task shows as missing and fails the table job;
#   - the GPU script on emulated GPUs (the node declares 2 GPUs; build/cooktrain-cuemu): one rank
#     per GPU, a tasks/GPUs mismatch refused, preemption and requeue bit-exact.
# long: the time limit itself (over a minute); the GPU script's preemption and requeue
# Skipped, with the reason, where the cluster cannot run (not root, SLURM not installed).
. "$(dirname "$0")/../tools/lib_cli.sh"
. "$(dirname "$0")/slurm_cluster.sh"
tmp=$(mktemp -d)
trap 'slurm_cluster_stop; rm -rf "$tmp"' EXIT

if ! slurm_cluster_start "$tmp/cluster"; then
    skip "SLURM tests: $SLURM_CLUSTER_WHY"
    exit 0
fi
ok "a private one-node SLURM cluster starts (sinfo shows the node idle)"

ensure_test_data
root=$(pwd)
# The jobs run in a scratch directory holding the repository's build, configs and scripts, as a
# user's checkout would; runs/ (logs, run and checkpoint directories) is the job's own.
work=$tmp/work
mkdir -p "$work/runs/slurm"
ln -s "$root/$BUILD" "$work/build"
ln -s "$root/configs" "$work/configs"
ln -s "$root/scripts" "$work/scripts"
export OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive
shape=(-N 1 --ntasks-per-node=2 --cpus-per-task=1 --chdir="$work")
train=(configs/test-tiny.yaml --set data.train="$root/$TEST_DATA/train.bin" --set train.threads=1
       --set train.warmup_steps=1)

at_step() { [ -f "$1" ] && grep -q "\"step\": *$2[,}]" "$1"; }
last_loss() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if "\"loss\"" in l][-1])' "$1"; }

# ---- sbatch: the job completes, its outputs in its directories -----------------------------------
if selected "sbatch"; then
    out=$(timeout 300 sbatch --wait --job-name=ct-basic "${shape[@]}" --time=10 scripts/slurm/cooktrain.sbatch \
        "${train[@]}" --set train.steps=4 --set checkpoint.interval=2 2>&1)
    rc=$?
    id=$(job_id "$out")
    run=$work/runs/ct-basic-$id
    if [ $rc = 0 ] && [ -n "$id" ]; then ok "sbatch of the CPU script completes (job $id, exit 0)"; else
        fail "sbatch of the CPU script: exit $rc ($out)"
        tail -5 "$work/runs/slurm/ct-basic-$id.log" 2>/dev/null | sed 's/^/    /'
    fi
    n=$(grep -c '"loss"' "$run/metrics.jsonl" 2>/dev/null)
    [ "$n" = 4 ] && ok "metrics of its 4 steps in the job's run dir" || fail "metrics in $run: $n step lines"
    [ -d "$run/checkpoints/step-00000004" ] && [ -d "$run/checkpoints/step-00000002" ] &&
        ok "its checkpoints (steps 2 and 4) in the job's checkpoint dir" ||
        fail "checkpoints in $run/checkpoints: $(ls "$run/checkpoints" 2>/dev/null | tr '\n' ' ')"
    grep -q "cooktrain: job $id (restart 0) on 1 nodes, 2 ranks" "$work/runs/slurm/ct-basic-$id.log" &&
        ok "the job's log is runs/slurm/ct-basic-$id.log" || fail "no job log runs/slurm/ct-basic-$id.log"
fi

# ---- preemption and requeue, bit-exact ----------------------------------------------------------
# preempt_check NAME WORK SCRIPT STEPS: in WORK, an uninterrupted `srun -n 2` reference run of
# STEPS steps (with "${ref_srun[@]}" before the executable), then SCRIPT submitted with
# "${job_shape[@]}", both training with "${job_train[@]}" (the config first); the job,
# signalled with USR1 after step 3, saves, requeues itself once, resumes and ends with the
# reference's final parameters (bit-identical) and last loss.
preempt_check() {
    local name=$1 work=$2 script=$3 steps=$4 out id run log k a b
    expect_exit 0 "$name: uninterrupted reference ($steps steps, srun -n 2)" -- env -C "$work" srun -n 2 \
        "${ref_srun[@]}" --mpi=pmix ./build/cooktrain train --config "${job_train[@]}" --set train.steps="$steps" \
        --set log.metrics="$tmp/$name-ref.jsonl" --dump-params "$tmp/$name-ref.bin"
    out=$(cd "$work" && sbatch --job-name="ct-$name" "${job_shape[@]}" --time=10 "$script" \
        "${job_train[@]}" --set train.steps="$steps" --dump-params "$tmp/$name.bin" 2>&1)
    id=$(job_id "$out")
    run=$work/runs/ct-$name-$id
    if [ -z "$id" ] || ! wait_for 60 at_step "$run/metrics.jsonl" 3; then
        fail "$name: job $id did not reach step 3 (state $(job_state "$id"); $out)"
        scancel "$id" 2>/dev/null
        return
    fi
    scancel --signal=USR1 --batch "$id"
    ok "$name: job $id signalled with USR1 after step 3"
    # a requeued job waits for its old credential to expire (10 s on the test cluster)
    wait_for 120 requeued_or_finished "$id"
    requeued "$id" && wait_for 120 finished "$id"
    if requeued_and_finished "$id"; then
        ok "$name: job $id was requeued once and finished ($(job_state "$id"))"
    else
        fail "$name: job $id: state $(job_state "$id"), restarts $(job_field "$id" Restarts)"
    fi
    log=$work/runs/slurm/ct-$name-$id.log
    grep -q "stopped with a checkpoint in .*; requeueing job $id" "$log" &&
        ok "$name: the preempted run saved and requeued the job" || fail "$name: no save-and-requeue line in $log"
    if grep -q "cooktrain: job $id (restart 1)" "$log"; then
        ok "$name: the requeued run started (restart 1)"
    else
        fail "$name: no restart 1 in $log ($(scontrol show job "$id" | grep -o 'Reason=[^ ]*\|ExitCode=[^ ]*' | tr '\n' ' '))"
        tail -4 "$log" | sed 's/^/    /'
        grep -i "job$id\|JobId=$id" "$SLURM_CLUSTER_DIR/log/slurmctld.log" | tail -6 | sed 's/^/    ctld: /'
    fi
    k=$(sed -n 's/^stopped after step \([0-9]*\) on SIGUSR1.*/\1/p' "$log" | head -1)
    if [ -n "$k" ] && [ "$k" -lt "$steps" ] &&
        grep -q "checkpoint: resumed from .*/step-$(printf %08d "$k") at step $k " "$log"; then
        ok "$name: the preempted run stopped after step $k on SIGUSR1; the requeued one resumed there"
    else
        fail "$name: stop and resume steps not found in $log (stopped after step '${k}')"
    fi
    if cmp -s "$tmp/$name.bin" "$tmp/$name-ref.bin"; then
        ok "$name: preempted + requeued job: final parameters bit-identical to the uninterrupted run"
    else
        fail "$name: preempted + requeued job: final parameters differ from the uninterrupted run"
    fi
    a=$(last_loss "$tmp/$name-ref.jsonl") b=$(last_loss "$run/metrics.jsonl")
    [ "$a" = "$b" ] && ok "$name: and the same last loss ($b)" || fail "$name: last loss $b, uninterrupted $a"
    # the requeued run appends to the job's metrics: every step once, in order, two segments
    if out=$(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows if "loss" in r]
starts = [r.get("start_step") for r in rows if r.get("setup")]
ok = steps == list(range(1, int(sys.argv[2]) + 1)) and len(starts) == 2 and starts[0] == 1
print(f"steps {steps[0]}..{steps[-1]} ({len(steps)}), segments from {starts}")
sys.exit(not ok)' "$run/metrics.jsonl" "$steps" 2>&1); then
        ok "$name: the job's metrics hold every step once: $out"
    else
        fail "$name: the job's metrics: $out"
    fi
}
if selected "preempt"; then
    ref_srun=()
    job_shape=("${shape[@]}")
    job_train=("${train[@]}")
    preempt_check pre "$work" scripts/slurm/cooktrain.sbatch 40
fi

# resume_check NAME CKPT_DIR: every checkpoint in CKPT_DIR verifies (cooktrain inspect), `latest`
# names the newest, and a new submission with the same directory resumes from it and finishes.
resume_check() {
    local name=$1 ckpt=$2 latest k bad=0 d out rc id
    for d in "$ckpt"/step-*; do
        [ -d "$d" ] || continue
        case $d in *.tmp) continue ;; esac
        "$BIN" inspect "$d" >/dev/null 2>&1 || bad=1
    done
    latest=$(cat "$ckpt/latest" 2>/dev/null)
    k=$(printf '%s' "$latest" | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p')
    if [ $bad = 0 ] && [ -n "$k" ] && [ -d "$ckpt/$latest" ]; then
        ok "$name: every checkpoint left verifies; latest is $latest"
    else
        fail "$name: checkpoints in $ckpt: $(ls "$ckpt" | tr '\n' ' ') (latest '$latest', bad $bad)"
        return
    fi
    out=$(CKPT_DIR=$ckpt RUN_DIR=$tmp/$name-next timeout 300 sbatch --wait --job-name="ct-$name-next" \
        "${shape[@]}" --time=10 scripts/slurm/cooktrain.sbatch "${train[@]}" \
        --set train.steps=$((k + 2)) 2>&1)
    rc=$?
    id=$(job_id "$out")
    if [ $rc = 0 ] && grep -q "checkpoint: resumed from .*/$latest at step $k " \
        "$work/runs/slurm/ct-$name-next-$id.log"; then
        ok "$name: the next submission resumes from $latest and finishes (exit 0)"
    else
        fail "$name: the next submission (job $id) exit $rc, or it did not resume from $latest"
        tail -5 "$work/runs/slurm/ct-$name-next-$id.log" 2>/dev/null | sed 's/^/    /'
    fi
}

# ---- cancelled, and at the time limit: SIGTERM, then SIGKILL 2 s later (KillWait) ------------------
# What SLURM sends a job at its time limit it also sends one cancelled with scancel: SIGTERM to
# the steps, SIGKILL KillWait (2 s) later. make test cancels a job once it has saved step 10;
# make test-long lets one reach its time limit, --time=1, SLURM's smallest (a minute, and the
# controller's check up to half a minute more). --no-requeue keeps the job from coming back, and
# --signal=B:URG@1 replaces the script's early warning with a signal bash ignores, so what ends
# the job is the cancel or the limit itself. Periodic checkpoints every 5 steps.
if selected "cancel"; then
    ckpt=$tmp/cn-ckpt
    out=$(CKPT_DIR=$ckpt RUN_DIR=$tmp/cn-run sbatch --job-name=ct-cn "${shape[@]}" --time=10 \
        --no-requeue --signal=B:URG@1 scripts/slurm/cooktrain.sbatch "${train[@]}" \
        --set train.steps=1000000 --set checkpoint.interval=5 --set checkpoint.keep=3 2>&1)
    id=$(job_id "$out")
    if [ -n "$id" ] && wait_for 120 test -d "$ckpt/step-00000010" && scancel "$id" &&
        wait_for 60 finished "$id"; then
        ok "a job cancelled after step 10 ends ($(job_state "$id"))"
        resume_check "cancel" "$ckpt"
    else
        fail "job $id was not cancelled after step 10 (state $(job_state "$id"))"
        scancel "$id" 2>/dev/null
    fi
fi
if selected "time limit" && long_part "time limit"; then
    ckpt=$tmp/tl-ckpt
    out=$(CKPT_DIR=$ckpt RUN_DIR=$tmp/tl-run sbatch --job-name=ct-tl "${shape[@]}" --time=1 \
        --no-requeue --signal=B:URG@1 scripts/slurm/cooktrain.sbatch "${train[@]}" \
        --set train.steps=1000000 --set checkpoint.interval=5 --set checkpoint.keep=3 2>&1)
    id=$(job_id "$out")
    if [ -n "$id" ] && wait_for 150 finished "$id"; then
        ok "a job past its one-minute limit ends ($(job_state "$id"))"
        resume_check "time-limit" "$ckpt"
    else
        fail "job $id did not end at its time limit (state $(job_state "$id"))"
        scancel "$id" 2>/dev/null
    fi
fi

# ---- a rank killed -----------------------------------------------------------------------------------
if selected "rank killed"; then
    ckpt=$tmp/kill-ckpt
    out=$(CKPT_DIR=$ckpt RUN_DIR=$tmp/kill-run sbatch --job-name=ct-kill "${shape[@]}" --time=10 \
        --no-requeue scripts/slurm/cooktrain.sbatch "${train[@]}" --set train.steps=1000000 \
        --set checkpoint.interval=2 2>&1)
    id=$(job_id "$out")
    if [ -n "$id" ] && wait_for 60 at_step "$tmp/kill-run/metrics.jsonl" 5; then
        victim=$(pgrep -f "checkpoint.dir=$ckpt" | while read -r p; do
            [ "$(cat /proc/"$p"/comm 2>/dev/null)" = cooktrain ] && echo "$p"; done | tail -1)
        kill -9 "$victim"
        if wait_for 60 finished "$id"; then
            ok "a rank killed with SIGKILL ends the job ($(job_state "$id")), no hang"
            resume_check "rank-killed" "$ckpt"
        else
            fail "the job with a killed rank is still $(job_state "$id") after 60 s"
            scancel "$id" 2>/dev/null
        fi
    else
        fail "job $id did not reach step 5"
        scancel "$id" 2>/dev/null
    fi
fi

# ---- a rank killed, the job requeued, local checkpoints ----------------------------------------------
# A job with a local checkpoint every step (in node memory: a folder the requeued job finds on the
# same node) and no persistent one before the end: a rank SIGKILLed after step 5 fails the job;
# `scontrol requeue` (what an operator, or the cluster after a node failure, does) starts it
# again with the same job id, so the same run and checkpoint directories: the requeued run
# gathers the newest local step and ends bit-identical to an uninterrupted run.
if selected "requeue local"; then
    steps=200
    job_train=("${train[@]}" --set train.steps=$steps --set checkpoint.local_interval=1
               --set checkpoint.local_dir="$tmp/node-local")
    expect_exit 0 "requeue local: uninterrupted reference ($steps steps, srun -n 2)" -- env -C "$work" \
        srun -n 2 --mpi=pmix ./build/cooktrain train --config "${train[@]}" --set train.steps=$steps \
        --set log.metrics="$tmp/requeue-ref.jsonl" --dump-params "$tmp/requeue-ref.bin"
    out=$(cd "$work" && sbatch --job-name=ct-requeue "${shape[@]}" --time=10 scripts/slurm/cooktrain.sbatch \
        "${job_train[@]}" --dump-params "$tmp/requeue.bin" 2>&1)
    id=$(job_id "$out")
    run=$work/runs/ct-requeue-$id
    if [ -n "$id" ] && wait_for 60 at_step "$run/metrics.jsonl" 5; then
        victim=$(pgrep -f "checkpoint.local_dir=$tmp/node-local" | while read -r p; do
            [ "$(cat /proc/"$p"/comm 2>/dev/null)" = cooktrain ] && echo "$p"; done | tail -1)
        kill -9 "$victim"
        if wait_for 60 finished "$id"; then
            ok "requeue local: a rank killed with SIGKILL ends job $id ($(job_state "$id"))"
            scontrol requeue "$id" 2>/dev/null
            wait_for 120 requeued "$id" && wait_for 120 finished "$id"
            log=$work/runs/slurm/ct-requeue-$id.log
            if requeued_and_finished "$id" && [ "$(job_state "$id")" = COMPLETED ]; then
                ok "requeue local: the requeued job completed"
            else
                fail "requeue local: job $id: state $(job_state "$id"), restarts $(job_field "$id" Restarts)"
                tail -5 "$log" | sed 's/^/    /'
            fi
            grep -qE "^checkpoint: local step [0-9]+ is newer" "$log" &&
                ok "requeue local: the requeued run gathered a local step" ||
                fail "requeue local: no local step gathered in $log"
            if cmp -s "$tmp/requeue.bin" "$tmp/requeue-ref.bin"; then
                ok "requeue local: final parameters bit-identical to the uninterrupted run"
            else
                fail "requeue local: final parameters differ from the uninterrupted run"
            fi
        else
            fail "requeue local: the job with a killed rank is still $(job_state "$id") after 60 s"
            scancel "$id" 2>/dev/null
        fi
    else
        fail "requeue local: job $id did not reach step 5"
        scancel "$id" 2>/dev/null
    fi
fi

# ---- scaling sweeps as a job array ------------------------------------------------------------------
# scripts/bench_scaling.sh --slurm: one array task per run, one at a time (--array-limit 1: the
# test node is shared), and a table job after the array.
scaling=(--config configs/test-tiny.yaml --set data.train="$root/$TEST_DATA/train.bin" --steps 3
         --array-limit 1 --sbatch "--time=5")
if selected "scaling array"; then
    expect_exit 0 "bench_scaling.sh --slurm --wait: a 3-task array and its table job" -- \
        scripts/bench_scaling.sh --slurm --wait --ranks "1 2" --out "$work/runs/scaling" "${scaling[@]}"
    dir=$work/runs/scaling
    if [ "$(grep -c '	ok	' "$dir/results.tsv" 2>/dev/null)" = 4 ] &&
        grep -q '^strong *2 *16 ' "$dir/table.txt" && grep -q '^weak *2 *32 ' "$dir/table.txt"; then
        ok "the table job collects strong 1, 2 and weak 1, 2 (4 rows with numbers) into table.txt"
    else
        fail "the sweep's table: $(cat "$dir/table.txt" 2>/dev/null | head -8)"
    fi
    for t in 0 1 2; do
        grep -q "^bench_scaling: array task $t of 3: " "$dir/slurm/task-$t.log" 2>/dev/null || break
    done
    [ "$t" = 2 ] && ok "each array task ran its own run (task logs 0-2)" || fail "task log $t: $(head -2 "$dir/slurm/task-$t.log" 2>&1)"
    grep -q '^grid: world 2 ' "$dir/2.weak.log" && grep -q '^grid: world 2 ' "$dir/2.strong.log" &&
        ok "the 2-rank runs are 2-rank jobs (srun inside the task's allocation)" ||
        fail "2-rank runs: $(grep -h '^grid' "$dir"/2.*.log)"
    expect_exit 0 "bench_scaling.sh --collect prints the same table again" -- scripts/bench_scaling.sh --collect "$dir"
    [ "$(printf '%s\n' "$OUT_TEXT" | grep -c '^\(strong\|weak\) ')" = 4 ] && ok "with its 4 rows" || fail "--collect: $OUT_TEXT"
fi
if selected "scaling missing"; then
    # a task cancelled before it ran: the table job still runs (afterany), shows it as missing and
    # fails
    out=$(scripts/bench_scaling.sh --slurm --mode strong --ranks "1 2" --out "$work/runs/scaling-cancel" \
        "${scaling[@]}" 2>&1)
    array=$(printf '%s\n' "$out" | sed -n 's/^submitted job array \([0-9]*\):.*/\1/p')
    table=$(printf '%s\n' "$out" | sed -n 's/^submitted the table job \([0-9]*\) .*/\1/p')
    [ -n "$array" ] && scancel "${array}_1"
    dir=$work/runs/scaling-cancel
    if [ -n "$table" ] && wait_for 60 finished "$table"; then
        [ "$(job_state "$table")" = FAILED ] && ok "with array task 1 cancelled, the table job fails (exit 1)" ||
            fail "the table job ended $(job_state "$table")"
        grep -q '^strong *2 *missing' "$dir/table.txt" && grep -q '^strong *1 *16 .*100.0%' "$dir/table.txt" &&
            ok "its table shows strong 1 measured and strong 2 missing" || fail "table: $(cat "$dir/table.txt")"
    else
        fail "no table job finished ($out)"
    fi
fi

# ---- the GPU script, on emulated GPUs ----------------------------------------------------------------
# The node declares 2 GPUs (GRES); the jobs run the emulated CUDA build (build/cooktrain-cuemu, its
# 2 devices from CUEMU_DEVICES) as ./build/cooktrain, so the script runs as written: one rank per
# GPU, --backend cuda, NCCL (the stand-in).
if [ -x "$root/$BUILD/cooktrain-cuemu" ]; then
    gwork=$tmp/gpu-work
    mkdir -p "$gwork/runs/slurm" "$gwork/build"
    ln -s "$root/$BUILD/cooktrain-cuemu" "$gwork/build/cooktrain"
    ln -s "$root/configs" "$gwork/configs"
    ln -s "$root/scripts" "$gwork/scripts"
    export CUEMU_DEVICES=2
    gshape=(-N 1 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --chdir="$gwork")
    gtrain=("${train[@]}" --set model.n_layer=2)
    if selected "gpu sbatch"; then
        out=$(timeout 300 sbatch --wait --job-name=ct-gpu "${gshape[@]}" --time=10 \
            scripts/slurm/cooktrain-gpu.sbatch "${gtrain[@]}" --set train.steps=3 --set checkpoint.interval=2 2>&1)
        rc=$?
        id=$(job_id "$out")
        log=$gwork/runs/slurm/ct-gpu-$id.log
        [ $rc = 0 ] && [ -n "$id" ] && ok "sbatch of the GPU script completes (job $id, exit 0)" ||
            fail "sbatch of the GPU script: exit $rc ($out; $(tail -3 "$log" 2>/dev/null))"
        grep -q "2 ranks (2 GPUs per node)" "$log" && grep -q '^rank 0: cuda device 0 ' "$log" &&
            grep -q '^rank 1: cuda device 1 (node-local rank 1 of 2, 2 devices)' "$log" &&
            ok "one rank per GPU: ranks 0 and 1 on devices 0 and 1" || fail "device lines in $log"
        [ -d "$gwork/runs/ct-gpu-$id/checkpoints/step-00000003" ] && [ "$(grep -c '"loss"' "$gwork/runs/ct-gpu-$id/metrics.jsonl")" = 3 ] &&
            ok "its metrics and checkpoints in the job's directories" || fail "outputs in $gwork/runs/ct-gpu-$id"
    fi
    if selected "gpu mismatch"; then
        out=$(timeout 300 sbatch --wait --job-name=ct-gpu-mismatch -N 1 --ntasks-per-node=2 --gpus-per-node=1 \
            --cpus-per-task=1 --chdir="$gwork" --time=10 scripts/slurm/cooktrain-gpu.sbatch "${gtrain[@]}" 2>&1)
        rc=$?
        id=$(job_id "$out")
        [ $rc = 2 ] && grep -q '^hint: one rank per GPU' "$gwork/runs/slurm/ct-gpu-mismatch-$id.log" &&
            ok "2 tasks per node with 1 GPU per node: the script exits 2 with a hint" ||
            fail "tasks/GPUs mismatch: exit $rc ($(cat "$gwork/runs/slurm/ct-gpu-mismatch-$id.log" 2>/dev/null))"
    fi
    if selected "gpu preempt" && long_part "gpu preempt"; then
        ref_srun=(--gpus-per-node=2 --cpus-per-task=1)
        job_shape=("${gshape[@]}")
        job_train=("${gtrain[@]}" --backend cuda)
        preempt_check gpu-pre "$gwork" scripts/slurm/cooktrain-gpu.sbatch 12
    fi
    unset CUEMU_DEVICES
else
    skip "GPU script tests: $BUILD/cooktrain-cuemu not built (needs the CUDA headers)"
fi
