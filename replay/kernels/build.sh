#!/bin/sh
# Rebuild diff.ptx from diff.cu (needs nvcc; the PTX is committed, the replay loads it with the
# driver's JIT, so no compiler is needed where it runs). compute_80: PTX any GPU from Ampere on JITs.
set -e
cd "$(dirname "$0")"
nvcc -ptx -arch=compute_80 -o diff.ptx diff.cu
