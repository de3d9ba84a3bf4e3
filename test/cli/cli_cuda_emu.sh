#!/usr/bin/env bash
# cli_cuda_emu.sh — the CUDA emulator (cuda/emu/) checked through its self-test
# (test/unit/cuemu_selftest.cc), one case per process: correct kernels match plain loops in every warp
# order, and each planted bug is reported the way cuda/emu/README.md promises (exit status and
# message). Each check below names the emulator feature it guards; every one was seen to FAIL with
# that feature switched off before it was trusted.
. "$(dirname "$0")/../tools/lib_cli.sh"

SELF=$BUILD/test/cuemu_selftest
ASAN=$BUILD/test/cuemu_selftest_asan
if [ ! -x "$SELF" ]; then
    skip "CUDA emulator tests: $SELF not built (needs g++ and the CUDA headers)"
    exit 0
fi

# relay CASE [ENV=VALUE...]: runs a correct case and relays its ok/FAIL lines; a non-zero exit
# without a FAIL line is a FAIL.
relay() {
    local case=$1 out rc
    shift
    out=$(env "$@" timeout 300 "$SELF" "$case" 2>&1 </dev/null)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|skip) '
    if [ $rc != 0 ] && ! printf '%s\n' "$out" | grep -q '^FAIL '; then
        fail "cuemu_selftest $case exited $rc"
        printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    fi
}

# ---- correct kernels against plain loops (reduce and softmax run all three orders) -----------
for c in reduce softmax atomics shuffles streams memory devices launch-checks bf16 mma cp-async; do relay "$c"; done
relay devices CUEMU_DEVICES=4 # guards CUEMU_DEVICES (several devices per node)
relay devices CUEMU_DEVICES=0 # guards cudaErrorNoDevice when no device is configured

# ---- stream capture and graphs (cudart_emu.cc's header states the rules) ----------------------
# Captured work runs only when a graph launch reaches a sync point, every item, in capture order,
# on the memory of the time (guards the capture queue and cudaGraphLaunch's copies; also with
# eager streams, which would run work at capture time if it were queued); each call a capture
# forbids is refused, does nothing and invalidates the capture (guards the refusals).
relay graphs
relay graphs CUEMU_EAGER=1
relay capture-refusals
expect_exit 0 "capture refusals" -- "$SELF" capture-refusals
expect_text "cuemu: stream capture invalidated: cudaMalloc during a capture" \
    "an invalidated capture: cudaStreamEndCapture says why"
expect_text "cuemu: stream capture invalidated: cudaEventRecord on a capturing stream (event nodes are not emulated)" \
    "an invalidated capture: names what is not emulated"
expect_exit 134 "the NCCL stand-in's polled work on a capturing stream aborts" -- "$SELF" capture-nccl
expect_text "cuemu: the NCCL stand-in's work cannot be captured in a graph" "captured NCCL work: says why"

# ---- planted bugs ----------------------------------------------------------------------------
# A missing __syncthreads: must give a wrong result in at least one order (guards the warp orders
# and that warps are not run in lockstep). Ascending order catches this one, descending does not.
caught=()
for order in ascending descending random:7; do
    CUEMU_ORDER=$order timeout 300 "$SELF" missing-sync >/dev/null 2>&1
    [ $? = 1 ] && caught+=("$order")
done
if [ ${#caught[@]} -gt 0 ]; then
    ok "missing __syncthreads gives a wrong result in order(s): ${caught[*]}"
else
    fail "missing __syncthreads went unnoticed in every order"
fi
# cp.async: a copy lands at the latest moment the PTX ISA allows in ascending order (at its
# wait) and at the earliest in descending (at its commit), so a read before the wait and a copy
# into a buffer other warps still read each give a wrong result (guards cuemu_cp_async's landing
# and the two orders' choice of it).
for bug in "cp-async-no-wait ascending" "cp-async-no-barrier descending"; do
    set -- $bug
    CUEMU_ORDER=$2 timeout 300 "$SELF" "$1" >/dev/null 2>&1
    rc=$?
    if [ $rc = 1 ]; then ok "$1 gives a wrong result in $2 order"; else fail "$1 went unnoticed in $2 order (exit $rc)"; fi
done
expect_exit 134 "a cp.async to global memory aborts" -- "$SELF" cp-async-global
expect_text "16 bytes of shared memory on a boundary of that size" "cp.async to global: says why"
expect_exit 2 "CUEMU_ORDER with an unknown order is refused" -- env CUEMU_ORDER=sideways "$SELF" reduce
expect_text "is not ascending, descending or random:SEED" "CUEMU_ORDER error names the choices"

# Warp operations: a mask naming an exited lane, mismatched operations, a deadlock (guards the
# per-lane arrival bookkeeping and the end-of-pass deadlock check).
expect_exit 134 "shuffle whose mask names exited lanes aborts" -- "$SELF" bad-mask
expect_text "__shfl_xor_sync mask 0xffffffff names lane 16, which exited" "bad mask: names the lane"
expect_text "(block 0,0,0 thread 0,0,0)" "bad mask: names block and thread"
expect_text "kernel bad_mask_kernel (launched at test/unit/cuemu_selftest.cc:" "bad mask: names the kernel"
# Tensor-core fragments (the mma case above) need 16-byte-aligned shared-memory rows for ldmatrix.
expect_exit 134 "an ldmatrix row address off its 16-byte boundary aborts" -- "$SELF" ldmatrix-misaligned
expect_text "lane 5's row address" "misaligned ldmatrix: names the lane"
expect_exit 134 "lanes at different warp operations abort" -- "$SELF" mismatch
expect_text "warp operations do not match" "mismatch: says so"
expect_exit 134 "a shuffle waiting for a lane at __syncthreads aborts" -- "$SELF" deadlock
expect_text "deadlock: this thread waits at __shfl_sync" "deadlock: says which operation waits"

# __syncthreads reached by part of the block (guards strict barriers, on by default)
expect_exit 134 "__syncthreads reached by part of the block aborts" -- "$SELF" partial-barrier
expect_text "__syncthreads reached by 32 of 128 threads" "partial barrier: counts the threads"
expect_text "(block 0,0,0 thread 0,0,0)" "partial barrier: names block and thread"
expect_exit 3 "CUEMU_STRICT=0 counts exited threads as arrived" -- \
    env CUEMU_STRICT=0 "$SELF" partial-barrier

# Static shared memory over 48 KB (guards the CT_SHARED arena limit ptxas enforces)
expect_exit 134 "more than 48 KB of CT_SHARED aborts" -- "$SELF" big-static-smem
expect_text "over the 48 KB a block may declare statically" "big static smem: says why"

# Poison: shared memory read before it is written, a missing stream sync (guards the NaN fill of
# CT_SHARED at every block start and the lazy streams)
relay uninit-shared
relay missing-stream-sync

# Out-of-bounds writes: caught by the ASan build (guards exact-size cudaMalloc and the poisoned
# redzones between CT_SHARED arrays); a correct kernel stays quiet under ASan.
if [ -x "$ASAN" ]; then
    expect_exit 1 "out-of-bounds CT_SHARED write under ASan" -- "$ASAN" oob-shared
    expect_text "AddressSanitizer: use-after-poison" "out-of-bounds shared write: ASan reports it"
    expect_text "oob_shared_kernel" "out-of-bounds shared write: ASan names the kernel"
    expect_exit 1 "out-of-bounds global write under ASan" -- "$ASAN" oob-global
    expect_text "AddressSanitizer: heap-buffer-overflow" "out-of-bounds global write: ASan reports it"
    for c in reduce streams graphs capture-refusals; do
        expect_exit 0 "$c under ASan has no reports" -- "$ASAN" "$c"
    done
else
    skip "ASan cases: $ASAN not built"
fi

# ---- wgmma (cuda/ct_wgmma.cuh) -------------------------------------------------------------------
# Asynchronous wgmma: two groups in flight, wait<1> completes the older and leaves the newer's D
# reading NaN, wait<0> the rest, in every order (guards the queue, the groups and the waits); each
# rule the emulator checks aborts with its reason (guards those checks: without them the bugs a
# pipelined kernel can make pass here and fail on a GPU).
expect_exit 0 "wgmma asynchronous: groups and waits" -- "$SELF" wgmma
for bug in "wgmma-operand-in-flight|B in shared memory changed between its first thread's issue and its wait" \
    "wgmma-d-in-flight|thread 0 wrote element 3 of the accumulator of instruction 0 while it was in flight" \
    "wgmma-no-fence|issued a wgmma with no wgmma.fence" \
    "wgmma-no-wait|the block ended with 2 wgmma instructions not waited for" \
    "wgmma-no-barrier|A in shared memory changed between its first thread's issue and its wait"; do
    expect_exit 134 "${bug%%|*} aborts" -- "$SELF" "${bug%%|*}"
    expect_text "${bug#*|}" "${bug%%|*}: says why"
done
if [ -x "$ASAN" ]; then
    expect_exit 0 "wgmma asynchronous under ASan has no reports" -- "$ASAN" wgmma
fi
# test/unit/wgmma_probe.cu against the emulator: every layout the emulator reads (the K-major ones, A in
# registers, the MN-major ones in variant 0) gives the host's D exactly, and every MN-major case
# written in the other reading (variant 1) does not, so the probe gpu_check.sh runs on a Hopper
# GPU tells the two readings apart (guards the emulator's descriptor decoding and its D and A
# register fragments, which the probe's kernel addresses as ct_wgmma.cuh documents them).
PROBE=$BUILD/test/wgmma_probe_emu
if [ -x "$PROBE" ]; then
    if expect_exit 0 "wgmma probe on the emulator" -- "$PROBE"; then
        n_match=$(printf '%s\n' "$OUT_TEXT" | grep -c '^case .*: match$' || true)
        n_v1=$(printf '%s\n' "$OUT_TEXT" | grep -c '^case .*variant 1: MISMATCH' || true)
        bad=$(printf '%s\n' "$OUT_TEXT" | grep '^case' | grep -v 'variant 1' | grep -v ': match$' || true)
        if [ "$n_match" = 7 ] && [ -z "$bad" ]; then
            ok "wgmma probe: the emulator reads all 7 of its own layouts (K-major, registers, MN-major variant 0)"
        else
            fail "wgmma probe: $n_match of 7 layouts match: $bad"
        fi
        if [ "$n_v1" = 3 ]; then
            ok "wgmma probe: the 3 MN-major cases in the other reading do not match (the probe tells them apart)"
        else
            fail "wgmma probe: $n_v1 of 3 variant-1 cases mismatch"
        fi
    fi
else
    skip "wgmma probe: $PROBE not built (needs the CUDA headers)"
fi

# ---- speed (informational, no assertion) -------------------------------------------------------
timeout 300 "$SELF" speed 2>&1 | grep '^speed:' | sed 's/^/    /'
