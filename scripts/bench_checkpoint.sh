#!/usr/bin/env bash
# Checkpoint throughput of the 124M model (configs/gpt2-124m.yaml, one process) against this
# disk, all measured in one run:
#   disk      sequential write of as many new random bytes (write + fsync; this VM's storage
#             writes content it has seen before several times faster) and read (dd,
#             iflag=direct, so the page cache does not answer), right after the save and the
#             load they are compared with (this VM's disk also drifts within minutes);
#   save      a synchronous save after one step: bytes / (write + fsync time), over dd's write;
#   async     the same save with checkpoint.async: the time training was blocked (copying the
#             state to host memory), over the synchronous save's time;
#   load      resuming from that checkpoint: bytes / load time (reading every piece and checking
#             its crc32), over dd's read — the page cache is dropped first where allowed, else
#             said.
# Goals (issue "Checkpoints"): save and load >= 0.7x the disk, blocked <= 10% of a sync save.
#
#   scripts/bench_checkpoint.sh [--dir DIR]     (DIR: where to write, default build/bench-ckpt)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/cooktrain
dir=$BUILD/bench-ckpt
while [ $# -gt 0 ]; do
    case $1 in
        --dir) dir=$2; shift 2 ;;
        *) echo "bench_checkpoint: unknown option $1" >&2; echo "hint: see the comment at the top of $0" >&2; exit 2 ;;
    esac
done
make --no-print-directory -s "$BIN"
[ -f data/fortunes/train.bin ] || bash scripts/prepare_corpus.sh "$BIN" data/fortunes >/dev/null
rm -rf "$dir"
mkdir -p "$dir"

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }

# dd prints "... copied, S s, R MB/s"; take bytes and seconds.
dd_rate() { awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") s = $(i - 1); printf "%.0f\n", $1 / s / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

run=("$BIN" train --config configs/gpt2-124m.yaml --set data.train=data/fortunes/train.bin
     --set train.steps=1 --set train.warmup_steps=0 --set train.global_batch=1 --set train.micro_batch=1
     --set log.sample_tokens=0)
# field NAME: the number after NAME in a report line on stdin
field() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" | head -1; }

# This VM's disk speed drifts by several times within minutes (a host cache in front of it), so
# each operation is compared with dd moving the same number of bytes right after it.
"${run[@]}" --set checkpoint.dir="$dir/sync" --set checkpoint.async=false >"$dir/sync.log" 2>&1
line=$(grep "checkpoint: step 1 saved" "$dir/sync.log")
mib=$(printf '%s' "$line" | sed -n 's/.*: \([0-9.]*\) MiB per rank.*/\1/p')
blocked_sync=$(printf '%s' "$line" | field "blocked")
written_sync=$(printf '%s' "$line" | field "written in")
bytes=$(awk -v m="$mib" 'BEGIN { printf "%.0f", m * 1048576 }')
# The disk's write speed for as many bytes of data it has never seen: this VM's storage writes
# repeated content several times faster (measured: the same 1.4 GB of random floats at 563 MB/s
# the first time and 1596 MB/s the second; dd copying the checkpoint's own rank file right after
# the save reached 2326 MB/s), so neither zeros nor the checkpoint's own bytes would do.
write_mbs=$(python3 - "$dir/dd.bin" "$bytes" <<'PY'
import os, random, sys, time
n = int(sys.argv[2])
data = b"".join(random.randbytes(64 << 20) for _ in range((n + (64 << 20) - 1) >> 26))[:n]
t = time.time()
with open(sys.argv[1], "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
print("%.0f" % (len(data) / (time.time() - t) / 1e6))
PY
)
sync_total=$(awk -v a="$blocked_sync" -v b="$written_sync" 'BEGIN { print a + b }')
save_mbs=$(mbps "$bytes" "$written_sync")
echo "== disk ($(df -h "$dir" | awk 'NR == 2 { print $1 }')), $mib MiB of new random bytes: write + fsync $write_mbs MB/s"
echo "== save (synchronous): $mib MiB written and fsynced in $written_sync s (+ $blocked_sync s staging)" \
     "= $save_mbs MB/s = $(ratio "$save_mbs" "$write_mbs")x the disk's write"

"${run[@]}" --set checkpoint.dir="$dir/async" --set checkpoint.async=true >"$dir/async.log" 2>&1
blocked=$(grep "checkpoint: step 1 saved" "$dir/async.log" | field "blocked")
echo "== save (asynchronous): training blocked $blocked s = $(awk -v a="$blocked" -v b="$sync_total" \
     'BEGIN { printf "%.1f", 100 * a / b }')% of the synchronous save's $sync_total s"

cache="dropped"
drop_caches || cache="not dropped (not permitted here)"
"${run[@]}" --set checkpoint.dir="$dir/sync" --set train.steps=1 >"$dir/load.log" 2>&1
loaded=$(grep "checkpoint: resumed" "$dir/load.log" | field "loaded in")
drop_caches || true
read_mbs=$(dd if="$dir/dd.bin" of=/dev/null bs=16M iflag=direct 2>&1 | dd_rate)
rm -f "$dir/dd.bin"
load_mbs=$(mbps "$bytes" "$loaded")
echo "== load (every checksum verified, page cache $cache): $mib MiB in $loaded s = $load_mbs MB/s" \
     "= $(ratio "$load_mbs" "$read_mbs")x dd's read ($read_mbs MB/s, O_DIRECT);" \
     "host buffers at most $(grep "checkpoint: resumed" "$dir/load.log" | field "at most") MiB"
