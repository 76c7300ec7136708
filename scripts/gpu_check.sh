#!/usr/bin/env bash
# The CUDA path of the suite and the experiments, in one run, for a lent GPU machine.
# Writes under $OUT (default ./gpu_out): the device profile, the fit report, each experiment's
# outputs, the device fingerprint, and everything again as one gpu_results.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PY:-python3}
if ! $PY -c "import torch, hydra, sklearn, pandas, rich, pytest" 2>/dev/null; then
  $PY -m pip install --quiet -e ".[test]" || $PY -m pip install --quiet numpy scipy scikit-learn hydra-core pandas matplotlib rich pytest
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia_smi.csv" || true
COMMON="device=cuda dtype=bfloat16 profile.root=$OUT/profiles progress=false"
export PYTHONPATH=$PWD
t0=$(date +%s)
$PY -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" || echo "gpu tests failed" | tee -a "$OUT/failures.txt"
$PY -m costmodel bench device=cuda dtype=bfloat16 profile.root="$OUT/profiles" hydra.run.dir="$OUT/bench" 2>&1 | tee "$OUT/bench.log"
$PY -m costmodel fit device=cuda dtype=bfloat16 profile.root="$OUT/profiles" hydra.run.dir="$OUT/fit" 2>&1 | tee "$OUT/fit.log"
for exp in moe_skew gnn_degree gemm_same_flops mlp_batch; do
  $PY -m sim experiment=$exp $COMMON hydra.run.dir="$OUT/$exp" 2>&1 | tee "$OUT/$exp.log" || echo "$exp failed" | tee -a "$OUT/failures.txt"
done
echo "wall_s=$(( $(date +%s) - t0 ))" > "$OUT/wall.txt"
tar -czf "$OUT/gpu_results.tar.gz" -C "$OUT" --exclude gpu_results.tar.gz .
