#!/usr/bin/env bash
# gpu_bundle.sh — the nvcc build and what it needs, packed to run on a GPU machine that has the
# NVIDIA stack (driver, CUDA runtime, cuBLAS; NCCL there or in PyTorch's environment) but not the
# Debian libraries this machine built against (libyaml, OpenBLAS, oneDNN, Open MPI, ...).
#
#   scripts/gpu_bundle.sh [OUT]     (default build/gpu-bundle.tar.xz)
#
# OUT ending in .tar.xz: an xz tarball (about 20 MB); anything else: a directory, the same tree
# unpacked. Its paths are the repository's, so on the GPU machine, in a checkout of the same
# commit:
#
#   tar -xJf build/gpu-bundle.tar.xz && bash scripts/gpu_check.sh && bash scripts/bench_gpu.sh
#
# What it holds:
#   build/cooktrain              a launcher: runs cooktrain.bin beside it with bundle-lib/ (and
#                                NCCL, where the system's loader does not find it, from the
#                                nvidia-nccl package of python3's environment) on LD_LIBRARY_PATH
#                                for that process alone, so that other programs (PyTorch) keep
#                                their own libraries;
#   build/cooktrain.bin, build/libcooktrain-cuda.so   the build (the plugin is found beside the
#                                executable);
#   build/bundle-lib/            every library the two link that is not the C library's
#                                (libc, libm, libdl, libpthread, librt, the loader), the C++
#                                runtime's (libstdc++, libgcc_s: the machine's own are as new) or
#                                the CUDA toolkit's and NCCL's (the machine's own match its driver);
#   data/fortunes, data/fortunes-bytes   `make data`'s corpora (gpu_check.sh trains on them),
#                                when they are there.
# Exits 2 with a hint when the build or `ldd` is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
out=${1:-$BUILD/gpu-bundle.tar.xz}

bad() { echo "gpu_bundle: $1" >&2; echo "hint: $2" >&2; exit 2; }
for f in "$BUILD/cooktrain" "$BUILD/libcooktrain-cuda.so"; do
    [ -f "$f" ] || bad "$f is missing" "build with nvcc on the PATH: make"
done
command -v ldd >/dev/null 2>&1 || bad "ldd not found" "install libc-bin (apt-get install libc-bin)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $out in *.tar.xz) stage=$tmp/stage ;; *) stage=$out; rm -rf "$stage" ;; esac
mkdir -p "$stage/build/bundle-lib"
cp "$BUILD/cooktrain" "$stage/build/cooktrain.bin"
cp "$BUILD/libcooktrain-cuda.so" "$stage/build/"

# the libraries: ldd's "name => path" lines, less the machine's own (see the top)
missing=$(ldd "$BUILD/cooktrain" "$BUILD/libcooktrain-cuda.so" | awk '/=> not found/ { print $1 }' | sort -u)
[ -z "$missing" ] || bad "ldd finds no $(echo $missing)" "bash scripts/setup.sh installs the libraries the build links"
ldd "$BUILD/cooktrain" "$BUILD/libcooktrain-cuda.so" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
    while read -r name path; do
        case $name in
            libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | \
                libstdc++.so.* | libgcc_s.so.* | \
                libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | libnvrtc*)
                continue ;;
        esac
        cp -L "$path" "$stage/build/bundle-lib/$name"
    done

cat >"$stage/build/cooktrain" <<'EOF'
#!/bin/sh
# cooktrain from scripts/gpu_bundle.sh: cooktrain.bin with the libraries of bundle-lib/ beside it,
# and NCCL from python3's nvidia-nccl package where the loader finds none, for this process alone.
d=$(dirname "$(readlink -f "$0")")
lib=$d/bundle-lib
if ! { ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; } && [ ! -f /usr/local/cuda/lib64/libnccl.so.2 ]; then
    nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) &&
        [ -f "$nccl/libnccl.so.2" ] && lib=$lib:$nccl
fi
LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$d/cooktrain.bin" "$@"
EOF
chmod +x "$stage/build/cooktrain"

for d in data/fortunes data/fortunes-bytes; do
    if [ -d "$d" ]; then
        mkdir -p "$stage/$d"
        cp "$d"/* "$stage/$d/"
    else
        echo "gpu_bundle: $d is not there (make data makes it; gpu_check.sh needs it)"
    fi
done

if [ "$stage" = "$out" ]; then
    echo "gpu_bundle: $out: $(du -sh "$out" | cut -f1) ($(ls "$out/build/bundle-lib" | wc -l) libraries)"
else
    mkdir -p "$(dirname "$out")"
    tar -C "$stage" -cf - . | xz -T0 -6 >"$out.tmp"
    mv "$out.tmp" "$out"
    echo "gpu_bundle: $out: $(du -h "$out" | cut -f1) ($(ls "$stage/build/bundle-lib" | wc -l) libraries); on the GPU machine: tar -xJf $out"
fi
