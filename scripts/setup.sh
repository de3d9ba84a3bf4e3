#!/usr/bin/env bash
# Installs the system packages cooktrain needs (Debian 12), skipping what is already present,
# so a second run costs one dpkg query. Run as root (or with sudo available).
set -euo pipefail

packages=(
    build-essential pkg-config
    libyaml-dev                 # config files
    libjansson-dev              # JSON: Hugging Face config.json and safetensors headers
    libopenblas-openmp-dev      # CPU GEMMs; the OpenMP build shares our thread pool
    libdnnl-dev                 # bf16 GEMMs (oneDNN matmul; AMX / AVX512-BF16)
    openmpi-bin libopenmpi-dev  # multi-process launch and the CPU comm layer
    libcmocka-dev               # unit-test assertions
    libisal-dev                 # CRC-32 of checkpoint pieces and parameter replicas (Intel ISA-L)
    fortunes                    # default corpus for `make run` (plain-text fortune files)
    slurm-wlm                   # the one-node test cluster of test/mpi/cli_slurm.sh (brings munge)
    clang libclang-rt-14-dev    # the fuzz targets of test/fuzz/ (libFuzzer, ASan, UBSan)
    python3
    python3-numpy               # scripts/reference_forward.py, the independent forward the tests check against
    chromium                    # test/cli/cli_report.sh renders `cooktrain report` pages headless
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
