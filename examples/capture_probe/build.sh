#!/bin/sh
# Builds the probe and its driver-launched module (sm_90a: clusters and TMA need Hopper).
# usage: examples/capture_probe/build.sh OUT_DIR
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build}
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
mkdir -p "$out"
"$nvcc" -O2 -std=c++17 -arch=sm_90a -o "$out/probe" "$here/probe.cu"
"$nvcc" -cubin -arch=sm_90a -o "$out/probe_mod.cubin" "$here/probe_mod.cu"
