#!/usr/bin/env bash
# Build and run te_gemm_host.cu on the lent GPU machine (issues 28/29): TE v2.9's per-GEMM
# cuBLASLt sequence and GroupedLinear's four-stream pass, timed on the host and the device.
#   bash benchmarks/device/te_gemm_host.sh OUTDIR
set -euo pipefail
out=${1:?output folder}
here=$(cd "$(dirname "$0")" && pwd)
cublas=""
for d in $(python3 -c "import sys; print(' '.join(sys.path))") /usr/local/cuda; do
  for c in "$d/nvidia/cu13" "$d"; do
    if [ -f "$c/include/cublasLt.h" ] && ls "$c"/lib*/libcublasLt.so* >/dev/null 2>&1; then
      cublas=$c; break 2
    fi
  done
done
[ -n "$cublas" ] || { echo "no cublasLt.h with its library found"; exit 1; }
lib=$(dirname "$(ls "$cublas"/lib*/libcublasLt.so* | head -1)")
lt=$(basename "$(ls "$lib"/libcublasLt.so.* | head -1)")
echo "cuBLASLt from $lib/$lt"
nvcc -O2 -std=c++17 "$here/te_gemm_host.cu" -I"$cublas/include" -L"$lib" -l:"$lt" \
  -Xlinker -rpath="$lib" -o /tmp/te_gemm_host
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > "$out/te_gemm_host_gpu.csv" || true
timeout 240 /tmp/te_gemm_host > "$out/te_gemm_host.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(len(d['cases']), 'cases; cuBLASLt', d['cublasLt_version'])" "$out/te_gemm_host.json"
