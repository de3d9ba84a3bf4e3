#!/usr/bin/env bash
# scripts/gpu_bundle.sh: the nvcc build and the Debian libraries it links, packed for a GPU machine
# that lacks them. The bundle's launcher must load every bundled library from bundle-lib/ (the
# loader's own account, LD_DEBUG=libs) and leave the C and C++ runtimes, CUDA and NCCL to the
# machine; a copy of the bundle outside the repository trains; the tarball form unpacks to the
# repository's paths; a missing build exits 2 with a hint.
. "$(dirname "$0")/../tools/lib_cli.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=scripts/gpu_bundle.sh

expect_exit 2 "gpu_bundle: no build is refused" -- env BUILD="$tmp/no-build" bash "$script" "$tmp/x"
expect_text "hint: build with nvcc" "gpu_bundle: the refusal has a hint"

if [ ! -f "$BUILD/libcooktrain-cuda.so" ]; then
    skip "gpu_bundle: $BUILD/libcooktrain-cuda.so not built (needs nvcc)"
    exit 0
fi
ensure_test_data
b=$tmp/bundle
expect_exit 0 "gpu_bundle: the build as a directory" -- bash "$script" "$b"
for f in build/cooktrain build/cooktrain.bin build/libcooktrain-cuda.so build/bundle-lib/libyaml-0.so.2 \
    build/bundle-lib/libopenblas.so.0 build/bundle-lib/libdnnl.so.2 build/bundle-lib/libmpi.so.40; do
    if [ -f "$b/$f" ]; then ok "gpu_bundle: holds $f"; else fail "gpu_bundle: $f is missing"; fi
done
extra=$(ls "$b/build/bundle-lib" | grep -E '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' || true)
if [ -z "$extra" ]; then ok "gpu_bundle: leaves the C and C++ runtimes, CUDA and NCCL to the machine"; else fail "gpu_bundle: bundles the machine's own $extra"; fi

# a copy outside the repository, as on the GPU machine: the launcher's libraries are the bundle's
cp -r "$b" "$tmp/moved"
mkdir -p "$tmp/moved/configs" && cp configs/test-tiny.yaml "$tmp/moved/configs/"
if expect_exit 0 "gpu_bundle: the moved launcher runs" -- env LD_DEBUG=libs "$tmp/moved/build/cooktrain" --version; then
    for lib in libyaml-0.so.2 libopenblas.so.0 libdnnl.so.2 libmpi.so.40; do
        if printf '%s\n' "$OUT_TEXT" | grep -q "calling init: $tmp/moved/build/bundle-lib/$lib\$"; then
            ok "gpu_bundle: $lib loads from the bundle"
        else
            fail "gpu_bundle: $lib does not load from the bundle: $(printf '%s\n' "$OUT_TEXT" | grep "calling init: .*$lib" | head -1)"
        fi
    done
fi
(cd "$tmp/moved" && expect_exit 0 "gpu_bundle: the moved bundle trains (CPU, 2 steps)" -- build/cooktrain train \
    --config configs/test-tiny.yaml --set train.steps=2 --set train.threads=1 --set data.train="$OLDPWD/$TEST_DATA/train.bin")

# the tarball form, on a stand-in build (no libraries beyond the C library's: xz stays quick)
mkdir -p "$tmp/fake"
cp /bin/true "$tmp/fake/cooktrain"
cp /bin/true "$tmp/fake/libcooktrain-cuda.so"
if expect_exit 0 "gpu_bundle: a tarball" -- env BUILD="$tmp/fake" bash "$script" "$tmp/t/b.tar.xz"; then
    mkdir -p "$tmp/unpack"
    if tar -xJf "$tmp/t/b.tar.xz" -C "$tmp/unpack" && [ -x "$tmp/unpack/build/cooktrain" ] &&
        [ -f "$tmp/unpack/build/cooktrain.bin" ] && [ -f "$tmp/unpack/build/libcooktrain-cuda.so" ]; then
        ok "gpu_bundle: the tarball unpacks to build/ as the repository has it"
    else
        fail "gpu_bundle: the tarball does not unpack to build/cooktrain, cooktrain.bin, libcooktrain-cuda.so"
    fi
fi
