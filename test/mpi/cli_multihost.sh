#!/usr/bin/env bash
# Multi-host for real, on one machine (README.md, Multi-node): two and four "hosts", each a network
# namespace with its own hostname and address, joined by a bridge (test/mpi/netns_hosts.sh); mpirun
# runs on host 0 and starts Open MPI's daemon on the others through a launch agent
# (test/mpi/netns_agent.sh, in ssh's place), ranks talk over TCP only (no shared memory between
# hosts), so every byte between hosts crosses the veth links:
#   - tp 2 x dp 2 on 2 hosts (tp inside a host, dp across), pp 2 x dp 2 on 2 hosts (pp across)
#     and tp 2 x pp 2 x dp 2 on 4 hosts train the same losses and parameters as world size 1
#     (test/tools/compare_runs.py's tolerances); the start-up report counts the hosts and says which
#     groups cross them; the links carried at least the traffic that had to cross them (dp: the
#     dp bytes rank 0 reports; pp: every microbatch's activations and their gradients);
#   - a rank placement with tp across hosts is named in the report, with the hint;
#   - host 1's ranks killed (SIGKILL) mid-run: the job ends, no hang, naming the host; the next
#     submission resumes from the last checkpoint and ends bit-identical to an uninterrupted run;
#   - host 1 frozen (SIGSTOP: a hung node): the watchdog on host 0 reports the collective it waits
#     in and ends the job; the next submission resumes, bit-identical again;
#   - local checkpoints every step (a folder per host): host 1's ranks killed, its folder wiped;
#     the next submission gathers the newest local step, host 1's files from their partners'
#     copies on host 0, bit-identical again;
#   - pp 2 x dp 4 on 4 hosts with local checkpoints: host 3's ranks killed, its folder wiped; the
#     next submission on 4 hosts (a new host 3) ends bit-identical to an uninterrupted run; one on
#     3 hosts instead (parallel.auto_layout) has the planner choose a layout for 6 ranks, gathers the newest local step
#     (host 3's files from host 0's copies) and resumes resharded, matching world size 1;
#   - a two-node SLURM cluster (a slurmd in each host) runs the CPU batch script across both
#     nodes (sbatch -N 2: srun and PMIx, no mpirun), tp inside a node and dp across, equal to
#     world size 1, its traffic over the link; then a job with local checkpoints every step loses
#     node h1's ranks, h1's folder is wiped, and `scontrol requeue` brings it back on both nodes:
#     it gathers the newest local step from the partners' copies, bit-identical again.
# Skipped, with the reason, where namespaces cannot be made (not root, an unprivileged container).
# long: host 1 frozen (the watchdog, not the launcher, ends the job)
. "$(dirname "$0")/../tools/lib_cli.sh"
. "$(dirname "$0")/netns_hosts.sh"
tmp=$(mktemp -d)
trap 'netns_hosts_stop; rm -rf "$tmp"' EXIT
mpi_setup
equivalence_setup
if ! netns_hosts_start "$tmp/hosts" 2; then
    skip "multi-host tests: $NETNS_HOSTS_WHY"
    exit 0
fi

# hosts_run NAME NHOSTS NP ARGS...: trains on NHOSTS namespace hosts (2 slots each) into
# $tmp/run.{jsonl,bin}; the output in $tmp/out.txt, host 1's link bytes before and after in
# link0/link1.
hosts_run() {
    local name=$1 nhosts=$2 np=$3
    shift 3
    netns_hosts_stop
    netns_hosts_start "$tmp/hosts" "$nhosts" || { fail "$name: hosts: $NETNS_HOSTS_WHY"; return 1; }
    link0=$(netns_link_bytes 1)
    rm -f "$tmp/run.jsonl" # a metrics file is appended to: this run's alone
    expect_exit 0 "$name: trains" -- "${NETNS_MPIRUN[@]}" -np "$np" "$BIN" "${base[@]}" "$@" \
        --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin" || return 1
    link1=$(netns_link_bytes 1)
    printf '%s\n' "$OUT_TEXT" >"$tmp/out.txt"
}

# check_hosts_line NAME TEXT: the start-up report's hosts line is exactly TEXT
check_hosts_line() {
    local line
    line=$(grep '^hosts: ' "$tmp/out.txt")
    if [ "$line" = "hosts: $2" ]; then
        ok "$1: the report says \"$line\""
    else
        fail "$1: hosts line \"$line\", expected \"hosts: $2\""
    fi
}

# check_link NAME FLOOR WHAT: host 1's link carried at least FLOOR bytes
check_link() {
    local carried=$((link1 - link0))
    if [ "$carried" -ge "$2" ]; then
        ok "$1: host 1's link carried $carried bytes >= $2 ($3)"
    else
        fail "$1: host 1's link carried $carried bytes < $2 ($3): did the ranks really run on two hosts?"
    fi
}

reference_run "$tmp"
# test-tiny: 4 steps, global batch 16 sequences of 32 tokens, d_model 64, fp32
steps=4 global=16 seq=32 d=64

if selected "tp x dp" && hosts_run "tp 2 x dp 2 on 2 hosts" 2 4 --set parallel.tp=2; then
    check_hosts_line "tp 2 x dp 2" "2 (ranks per host: 2 2); tp groups within a host, dp groups across hosts"
    check_against_reference "tp 2 x dp 2 on 2 hosts" "$tmp"
    # every dp all-reduce pairs a rank of host 0 with one of host 1: at least rank 0's dp bytes
    dp=$(python3 -c 'import json,sys; print(sum(json.loads(l).get("dp_bytes", 0) for l in open(sys.argv[1])))' "$tmp/run.jsonl")
    check_link "tp 2 x dp 2" "$dp" "rank 0's dp bytes, all between hosts"
fi

if selected "pp x dp" && hosts_run "pp 2 x dp 2 on 2 hosts" 2 4 --set parallel.pp=2; then
    check_hosts_line "pp 2 x dp 2" "2 (ranks per host: 2 2); pp groups across hosts, dp groups within a host"
    check_against_reference "pp 2 x dp 2 on 2 hosts" "$tmp"
    # each sequence's activations go forward to stage 1 and their gradients come back: fp32
    check_link "pp 2 x dp 2" $((steps * global * seq * d * 4 * 2)) "activations and their gradients between the stages"
fi

if selected "tp x pp x dp" && hosts_run "tp 2 x pp 2 x dp 2 on 4 hosts" 4 8 --set parallel.tp=2 --set parallel.pp=2; then
    check_hosts_line "tp 2 x pp 2 x dp 2" "4 (ranks per host: 2 2 2 2); tp groups within a host, pp groups across hosts, dp groups across hosts"
    check_against_reference "tp 2 x pp 2 x dp 2 on 4 hosts" "$tmp"
fi

# 3 ranks per host: the second tp pair straddles hosts 0 and 1
if selected "tp across" && NETNS_SLOTS=3 hosts_run "tp 2 x dp 3 on 2 hosts of 3" 2 6 \
    --set parallel.tp=2 --set train.global_batch=12; then
    check_hosts_line "tp 2 x dp 3, 3 ranks per host" "2 (ranks per host: 3 3); tp groups across hosts, dp groups across hosts (tp across hosts is slow: give each host a multiple of tp=2 ranks, filled in rank order, e.g. mpirun --map-by slot)"
fi

# ---- a host lost mid-run ------------------------------------------------------------------------
# fault_run NAME SIGNAL: a long run (dp 4, 2 ranks per host, a checkpoint every 5 steps) whose
# host 1 ranks get SIGNAL once step 10's checkpoint exists; the job must end within 90 s. Then
# the same command again resumes from the newest checkpoint (checkpoint.resume: auto) and must end
# bit-identical to $tmp/whole.bin, the uninterrupted run.
long=(--set train.steps=120 --set checkpoint.interval=5 --set parallel.timeout_s=5)
fault_run() {
    local name=$1 sig=$2 d=$tmp/fault-$2 pid rc waited=0
    selected "$name" || return 0
    mkdir -p "$d"
    netns_hosts_stop
    netns_hosts_start "$tmp/hosts" 2 || { fail "$name: hosts: $NETNS_HOSTS_WHY"; return 0; }
    "${NETNS_MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${long[@]}" --set checkpoint.dir="$d/ck" \
        >"$d/out.txt" 2>&1 </dev/null &
    pid=$!
    while [ ! -d "$d/ck/step-00000010" ] && [ $waited -lt 1200 ] && kill -0 "$pid" 2>/dev/null; do
        sleep 0.05
        waited=$((waited + 1))
    done
    # the ranks on host 1 (its daemon, orted, stays: it is the node's launcher, not a rank)
    local ranks
    ranks=$(for p in $(netns_host_pids 1); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = cooktrain ] && echo "$p"
    done)
    # shellcheck disable=SC2086
    [ -n "$ranks" ] && kill -"$sig" $ranks
    (sleep 90 && touch "$d/hung" && kill -9 "$pid") >/dev/null 2>&1 & # (its sleep must not hold our output open)
    local guard=$!
    wait "$pid"
    rc=$?
    kill "$guard" 2>/dev/null
    if [ -z "$ranks" ]; then
        fail "$name: no rank of host 1 to signal (the run ended before step 10's checkpoint?)"
        return 0
    fi
    # (mpirun's status after a rank's SIGKILL is 137, as is the guard's: the guard leaves a mark)
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ ! -e "$d/hung" ] && ! grep -q '^step   120/120' "$d/out.txt"; then
        ok "$name: the job ends (exit $rc) without finishing"
    else
        fail "$name: the job ends (exit $rc) without finishing"
        tail -5 "$d/out.txt" | sed 's/^/    /'
    fi
    case $sig in
    KILL) # Open MPI names the rank and its host as the hostfile does
        expect_file_text "$d/out.txt" "process rank [23] .* on node 198\.18\.0\.2 exited on signal 9" \
            "$name: mpirun's report names a rank of host 1 (198.18.0.2)" ;;
    STOP) # the watchdog on host 0 names the collective its rank waits in
        expect_file_text "$d/out.txt" "collective timed out on rank [01]: group .*waited [0-9.]* s" \
            "$name: the watchdog on host 0 reports the collective it waits in" ;;
    esac
    # resume: the same submission again (the frozen ranks were killed with the job)
    netns_hosts_stop
    netns_hosts_start "$tmp/hosts" 2 || { fail "$name: hosts: $NETNS_HOSTS_WHY"; return 0; }
    if expect_exit 0 "$name: the next submission resumes" -- "${NETNS_MPIRUN[@]}" -np 4 "$BIN" \
        "${base[@]}" "${long[@]}" --set checkpoint.dir="$d/ck" --dump-params "$d/run.bin"; then
        expect_text "resum" "$name: it says it resumed"
        if cmp -s "$tmp/whole.bin" "$d/run.bin"; then
            ok "$name: resumed run ends bit-identical to the uninterrupted one"
        else
            fail "$name: resumed run ends bit-identical to the uninterrupted one"
        fi
    fi
}

# expect_file_text FILE REGEX NAME
expect_file_text() {
    if grep -qE -- "$2" "$1"; then ok "$3"; else
        fail "$3 (no line matching \"$2\")"
        tail -5 "$1" | sed 's/^/    /'
    fi
}

if selected "host lost" && netns_hosts_stop && netns_hosts_start "$tmp/hosts" 2; then
    expect_exit 0 "host lost: the uninterrupted run on 2 hosts" -- "${NETNS_MPIRUN[@]}" -np 4 "$BIN" \
        "${base[@]}" "${long[@]}" --set checkpoint.dir="$tmp/whole-ck" --dump-params "$tmp/whole.bin" &&
        fault_run "host lost: host 1's ranks killed" KILL &&
        { ! long_part "host lost: host 1 frozen" || fault_run "host lost: host 1 frozen" STOP; }
fi

# kill_host_at HOST PATTERN [PID]: once a path matching PATTERN exists (a local step published),
# SIGKILLs every cooktrain rank of HOST and waits for the job PID to end (at most 90 s more);
# $ranks says whom it killed (empty: the job ended first). Without a PID (a SLURM job: the
# caller watches its state) it waits at most 60 s for the path and returns once it has killed.
kill_host_at() {
    local waited=0 guard p
    # shellcheck disable=SC2086
    while ! ls -d $2 >/dev/null 2>&1 && [ $waited -lt 1200 ] && { [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null; }; do
        sleep 0.05
        waited=$((waited + 1))
    done
    ranks=$(for p in $(netns_host_pids "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = cooktrain ] && echo "$p"
    done)
    # shellcheck disable=SC2086
    [ -n "$ranks" ] && kill -KILL $ranks
    [ -z "${3:-}" ] && return 0
    (sleep 90 && kill -9 "$3") >/dev/null 2>&1 &
    guard=$!
    wait "$3"
    kill "$guard" 2>/dev/null
}

# ---- local checkpoints across hosts -------------------------------------------------------------
# The long run with a local checkpoint every step (checkpoint.local_dir per host: %h) and no
# persistent one before the end: host 1's ranks killed once local step 12 exists, then host 1's
# local folder wiped (a replaced node). The next submission gathers the newest local step, host 1's
# two rank files from the copies their partners on host 0 kept, and ends bit-identical to the
# uninterrupted run.
if selected "local checkpoints" && [ -f "$tmp/whole.bin" ] && netns_hosts_stop &&
    netns_hosts_start "$tmp/hosts" 2; then
    d=$tmp/local
    mkdir -p "$d"
    loc=(--set checkpoint.dir="$d/ck" --set checkpoint.interval=1000 --set checkpoint.local_interval=1
         --set checkpoint.local_dir="$d/local/%h")
    "${NETNS_MPIRUN[@]}" -np 4 "$BIN" "${base[@]}" "${long[@]}" "${loc[@]}" >"$d/out.txt" 2>&1 </dev/null &
    kill_host_at 1 "$d/local/0/*/rank-00000/step-00000012" $!
    if [ -z "$ranks" ] || grep -q '^step   120/120' "$d/out.txt"; then
        fail "local checkpoints: host 1's ranks killed before the end"
    else
        ok "local checkpoints: host 1's ranks killed after local step 12"
        rm -rf "$d/local/1" # the replaced node's local storage is empty
        netns_hosts_stop
        netns_hosts_start "$tmp/hosts" 2 || fail "local checkpoints: hosts: $NETNS_HOSTS_WHY"
        if expect_exit 0 "local checkpoints: the next submission" -- "${NETNS_MPIRUN[@]}" -np 4 "$BIN" \
            "${base[@]}" "${long[@]}" "${loc[@]}" --dump-params "$d/run.bin"; then
            expect_text "(2 from partners' copies" "local checkpoints: host 1's files came from host 0's copies"
            if printf '%s\n' "$OUT_TEXT" | grep -qE "^checkpoint: local step (1[2-9]|[2-9][0-9]) is newer"; then
                ok "local checkpoints: a local step from 12 on gathered"
            else
                fail "local checkpoints: no local step from 12 on gathered"
            fi
            if cmp -s "$tmp/whole.bin" "$d/run.bin"; then
                ok "local checkpoints: the restarted run ends bit-identical to the uninterrupted one"
            else
                fail "local checkpoints: the restarted run differs from the uninterrupted one"
            fi
        fi
    fi
fi

# ---- a lost host, restarted on as many and on fewer ----------------------------------------------
# pp 2 x dp 4 on 4 hosts (8 ranks), global batch 12, a local checkpoint every step: host 3's ranks
# (pipeline stage 1's dp ranks 2 and 3) killed once local step 6 exists, host 3's folder wiped.
# From a copy of what is left, the next submission on 4 hosts (host 3 a new node) gathers host
# 3's files from host 0's copies and ends bit-identical to an uninterrupted run on 4 hosts.
# From what is left again, a submission on 3 hosts (6 ranks) with parallel.auto_layout chooses a
# layout for 6 ranks with the planner, gathers the newest local step (host 3's two files from their partners' copies on host 0),
# resumes it resharded, and the run — the first job's steps up to the resume, the second's
# after — matches world size 1 (compare_runs.py's tolerances: the layout changed, so not bits).
if selected "fewer hosts" && netns_hosts_stop && netns_hosts_start "$tmp/hosts" 4; then
    d=$tmp/fewer
    mkdir -p "$d"
    few=(--set train.global_batch=12 --set train.micro_batch=auto --set train.steps=60 --set parallel.pp=2
         --set parallel.timeout_s=5)
    loc=(--set checkpoint.dir="$d/ck" --set checkpoint.local_interval=1 --set checkpoint.local_dir="$d/local/%h"
         --set parallel.auto_layout=true)
    expect_exit 0 "fewer hosts: reference (world size 1)" -- "$BIN" "${base[@]}" "${few[@]}" \
        --set parallel.pp=1 --set log.metrics="$d/ref.jsonl" --dump-params "$d/ref.bin" \
        --dump-init-params "$d/init.bin"
    "${NETNS_MPIRUN[@]}" -np 8 "$BIN" "${base[@]}" "${few[@]}" "${loc[@]}" --set parallel.dp=4 \
        --set log.metrics="$d/run.jsonl" >"$d/out.txt" 2>&1 </dev/null &
    kill_host_at 3 "$d/local/0/*/rank-00000/step-00000006" $!
    if [ -z "$ranks" ] || grep -q '^step    60/60' "$d/out.txt"; then
        fail "fewer hosts: host 3's ranks killed before the end"
    else
        ok "fewer hosts: host 3's ranks killed after local step 6"
        rm -rf "$d/local/3" # that node is gone
        # first the same size, from a copy of what the crash left: host 3 replaced by a new node
        cp -a "$d/local" "$d/local.kept"
        cp -a "$d/run.jsonl" "$d/run.kept.jsonl"
        netns_hosts_stop
        netns_hosts_start "$tmp/hosts" 4 || fail "fewer hosts: hosts: $NETNS_HOSTS_WHY"
        expect_exit 0 "fewer hosts: an uninterrupted run on 4 hosts" -- "${NETNS_MPIRUN[@]}" -np 8 \
            "$BIN" "${base[@]}" "${few[@]}" --set parallel.dp=4 --set checkpoint.dir="$d/whole-ck" \
            --dump-params "$d/whole.bin"
        if expect_exit 0 "fewer hosts: a new host 3, the next submission on 4 hosts" -- \
            "${NETNS_MPIRUN[@]}" -np 8 "$BIN" "${base[@]}" "${few[@]}" "${loc[@]}" --set parallel.dp=4 \
            --set log.metrics="$d/run.jsonl" --dump-params "$d/same.bin"; then
            expect_text "(2 from partners' copies" "fewer hosts: the new host 3's files came from host 0's copies"
            if cmp -s "$d/whole.bin" "$d/same.bin"; then
                ok "fewer hosts: restarted on 4 hosts, bit-identical to the uninterrupted run"
            else
                fail "fewer hosts: restarted on 4 hosts, the parameters differ from the uninterrupted run"
            fi
        fi
        rm -rf "$d/local" "$d/ck"
        mv "$d/local.kept" "$d/local"
        mv "$d/run.kept.jsonl" "$d/run.jsonl"
        netns_hosts_stop
        netns_hosts_start "$tmp/hosts" 3 || fail "fewer hosts: hosts: $NETNS_HOSTS_WHY"
        if expect_exit 0 "fewer hosts: the next submission, on 3 hosts" -- "${NETNS_MPIRUN[@]}" -np 6 \
            "$BIN" "${base[@]}" "${few[@]}" "${loc[@]}" --set parallel.dp=4 \
            --set log.metrics="$d/run.jsonl" --dump-params "$d/run.bin"; then
            expect_layout_chosen "tp 1 x pp 2 x dp 4" 6 "fewer hosts: it says which layout it chose for 6 ranks"
            expect_text "(2 from partners' copies" "fewer hosts: host 3's files came from host 0's copies"
            resumed=$(printf '%s\n' "$OUT_TEXT" | sed -n 's/^checkpoint: local step \([0-9]*\) is newer.*/\1/p')
            if [ -n "$resumed" ] && [ "$resumed" -ge 5 ]; then
                ok "fewer hosts: local step $resumed gathered (at most one step before the one seen)"
                # the metrics file holds both jobs: compare_runs.py stitches them (the
                # second's steps replace the first's from the resume on)
                if out=$(python3 test/tools/compare_runs.py "$d/ref.jsonl" "$d/ref.bin" "$d/run.jsonl" \
                    "$d/run.bin" --init "$d/init.bin"); then
                    ok "fewer hosts: the run, 8 ranks then 6, matches world size 1; $out"
                else
                    fail "fewer hosts: $out"
                fi
            else
                fail "fewer hosts: no local step from 5 on gathered"
            fi
        fi
    fi
fi

# ---- a two-node SLURM cluster --------------------------------------------------------------------
# slurm_requeue (in the cluster below): the long run as a batch job on both nodes (dp 4, 2 ranks
# per node), a local checkpoint every step in a folder per node and no persistent one before the
# end; node h1's ranks killed once local step 12 exists, which fails the job; h1's folder wiped (a
# replaced node, or a job-scoped tmpfs that went with the job); `scontrol requeue` starts the job
# again with the same id, so the same run and checkpoint directories: the requeued run gathers
# the newest local step, h1's files from their partners' copies on h0, and ends bit-identical to
# the uninterrupted run of "host lost".
slurm_requeue() {
    local name="two-node requeue" rq=$tmp/requeue out id log
    selected "$name" || return 0
    if [ ! -f "$tmp/whole.bin" ]; then
        skip "$name: it compares with the uninterrupted run of \"host lost\", which did not run"
        return 0
    fi
    mkdir -p "$rq"
    out=$("${SLURM_CLUSTER_CLIENT[@]}" sbatch --job-name=ct-requeue -N 2 --ntasks-per-node=2 \
        --cpus-per-task=1 --chdir="$work" --time=10 scripts/slurm/cooktrain.sbatch configs/test-tiny.yaml \
        "${base[@]:3}" "${long[@]}" --set checkpoint.interval=1000 --set checkpoint.local_interval=1 \
        --set checkpoint.local_dir="$rq/local/%h" --dump-params "$rq/run.bin" 2>&1)
    id=$(job_id "$out")
    log=$work/runs/slurm/ct-requeue-$id.log
    if [ -z "$id" ]; then
        fail "$name: sbatch: $out"
        return 0
    fi
    kill_host_at 1 "$rq/local/0/*/rank-00000/step-00000012"
    if [ -z "$ranks" ] || ! wait_for 60 finished "$id"; then
        fail "$name: job $id: h1's ranks killed after local step 12 (${ranks:-none}), state $(job_state "$id")"
        "${SLURM_CLUSTER_CLIENT[@]}" scancel "$id" 2>/dev/null
        return 0
    fi
    ok "$name: h1's ranks killed after local step 12 end job $id ($(job_state "$id"))"
    rm -rf "$rq/local/1" # the replaced node's local storage is empty
    "${SLURM_CLUSTER_CLIENT[@]}" scontrol requeue "$id" 2>/dev/null
    # a requeued job waits for its old credential to expire (10 s on the test cluster)
    wait_for 120 requeued "$id" && wait_for 180 finished "$id"
    if requeued_and_finished "$id" && [ "$(job_state "$id")" = COMPLETED ]; then
        ok "$name: the requeued job completed on both nodes"
    else
        fail "$name: job $id: state $(job_state "$id"), restarts $(job_field "$id" Restarts)"
        tail -5 "$log" | sed 's/^/    /'
        "${SLURM_CLUSTER_CLIENT[@]}" scancel "$id" 2>/dev/null
        return 0
    fi
    expect_file_text "$log" "cooktrain: job $id \(restart 1\) on 2 nodes, 4 ranks" "$name: the log says restart 1, 2 nodes"
    expect_file_text "$log" "\(2 from partners' copies" "$name: h1's files came from h0's copies"
    expect_file_text "$log" "^checkpoint: local step (1[2-9]|[2-9][0-9]) is newer" "$name: a local step from 12 on gathered"
    if cmp -s "$tmp/whole.bin" "$rq/run.bin"; then
        ok "$name: the requeued run ends bit-identical to the uninterrupted one"
    else
        fail "$name: the requeued run differs from the uninterrupted one"
    fi
}

# One slurmd in each host's namespace (test/mpi/slurm_cluster.sh with SLURM_CLUSTER_HOSTS), the CPU
# batch script submitted with -N 2 --ntasks-per-node=2: srun starts two ranks on each node
# through PMIx, which wire up over TCP across the link (the runtime places them on two nodes, so
# no shared memory between them); tp 2 inside each node, dp 2 across: the same losses and
# parameters as world size 1.
if selected "slurm"; then
    . "$(dirname "$0")/slurm_cluster.sh"
    netns_hosts_stop
    if ! netns_hosts_start "$tmp/hosts" 2; then
        fail "slurm: hosts: $NETNS_HOSTS_WHY"
    else
        SLURM_CLUSTER_HOSTS=("${NETNS_HOSTS_NS[@]}")
        trap 'slurm_cluster_stop; netns_hosts_stop; rm -rf "$tmp"' EXIT
        if ! slurm_cluster_start "$tmp/cluster"; then
            skip "two-node SLURM: $SLURM_CLUSTER_WHY"
        else
            ok "a two-node SLURM cluster starts (h0 and h1 idle, one slurmd in each host's namespace)"
            work=$tmp/work
            mkdir -p "$work/runs/slurm"
            root=$(pwd)
            ln -s "$root/$BUILD" "$work/build"
            ln -s "$root/configs" "$work/configs"
            ln -s "$root/scripts" "$work/scripts"
            link0=$(netns_link_bytes 1)
            rm -f "$tmp/run.jsonl" # a metrics file is appended to: this run's alone
            out=$(timeout 300 "${SLURM_CLUSTER_CLIENT[@]}" sbatch --wait --job-name=ct-2node -N 2 \
                --ntasks-per-node=2 --cpus-per-task=1 --chdir="$work" --time=10 \
                scripts/slurm/cooktrain.sbatch configs/test-tiny.yaml "${base[@]:3}" \
                --set parallel.tp=2 --set log.metrics="$tmp/run.jsonl" --dump-params "$tmp/run.bin" 2>&1)
            rc=$?
            link1=$(netns_link_bytes 1)
            id=$(printf '%s\n' "$out" | sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' | tail -1)
            log=$work/runs/slurm/ct-2node-$id.log
            if [ $rc = 0 ] && [ -n "$id" ]; then
                ok "the CPU batch script runs across both nodes (job $id, exit 0)"
                if grep -q "cooktrain: job $id (restart 0) on 2 nodes, 4 ranks" "$log"; then
                    ok "its log says 2 nodes, 4 ranks"
                else
                    fail "its log says 2 nodes, 4 ranks"
                fi
                printf '%s\n' "$(cat "$log")" >"$tmp/out.txt"
                check_hosts_line "slurm tp 2 x dp 2" "2 (ranks per host: 2 2); tp groups within a host, dp groups across hosts"
                check_against_reference "SLURM tp 2 x dp 2 on 2 nodes" "$tmp"
                dp=$(python3 -c 'import json,sys; print(sum(json.loads(l).get("dp_bytes", 0) for l in open(sys.argv[1])))' "$tmp/run.jsonl")
                check_link "slurm tp 2 x dp 2" "$dp" "rank 0's dp bytes, all between the nodes"
            else
                fail "the CPU batch script across both nodes: exit $rc ($out)"
                tail -5 "$log" 2>/dev/null | sed 's/^/    /'
                # the job's and the daemons' logs outlive $tmp, for finding out why
                keep=$BUILD/test-logs/cli_multihost-slurm
                rm -rf "$keep" && mkdir -p "$keep"
                cp "$log" "$tmp"/cluster/log/*.log "$keep"/ 2>/dev/null || true
                echo "    the job's log and the SLURM daemons' logs: $keep"
            fi
            slurm_requeue
        fi
        slurm_cluster_stop
    fi
fi
