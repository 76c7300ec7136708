#!/usr/bin/env bash
# The CUDA path of the project in one run, for a lent GPU machine (an H200 with this workplace's
# 'cuda' image: Python 3.12, its own torch 2.11 + CUDA 13, pandas, scikit-learn, scipy, matplotlib,
# rich, pytest, transformers and torch-geometric, but no hydra-core / omegaconf / antlr4, and no
# package index). Nothing is installed from an index: the pure-Python wheels the image lacks travel
# in .whl/ (`make gpu-wheels` here, then name `.whl` in the device call's carry) and are installed
# with `pip install --no-index --no-deps --target`; the project runs from the source tree.
#
#   make gpu-wheels                                   # here, once: fills .whl/
#   scripts/gpu_check.sh                              # there: writes under $OUT
#   DRY_RUN=1 scripts/gpu_check.sh                    # here: the same script on the CPU, tiny sizes
#   STAGES="moe_skew hf_moe" scripts/gpu_check.sh     # a rerun of some stages only (preflight always runs)
#   EXTRA_moe_skew="moe.tokens=256" scripts/gpu_check.sh   # extra Hydra overrides for one stage
#
# Stages survive each other: each runs under its own time budget (`timeout`, SIGINT first so a
# bench keeps what it measured), logs to its own file, and records its wall time and exit status
# in wall.json; after every stage all outputs so far are packed again into gpu_results.tar.gz, so
# a failure or a time-out in one stage still returns everything before it and the next stages
# still run. The device tool returns at most 8 files from $OUT: this script writes 5
# (gpu_results.tar.gz, wall.json, stages.txt, gpu_check.log, env.json).
#
# Budgets, from the first lease (2026-12-04, H200, torch 2.11+cu130). The GPU is quiet and CUDA-event
# timing is precise, so kernels use a shorter do_bench budget (5 ms warm-up, 25 ms of repeats) and
# 2 rounds; even so, calibrating a kernel costs about 0.25 s of wall time (inputs, L2 flush, two
# rounds), and every experiment calibrates the hundreds of kernels its traces hold before it
# measures a layer: moe_skew from an empty profile took 81 s of calibration, 34 s of fits and 60 s
# of layer rounds (12 of 30 points still varied >10% between rounds after 4 extra rounds). So:
# - the committed GPU profile (profiles/cuda-*) seeds the run's profile: kernels an earlier lease
#   measured are not measured again, and each lease's profile comes back in the tarball to be
#   committed, so the GPU profile grows lease by lease;
# - stages run most valuable first, and one that would end past TOTAL_S (default 540 s of the
#   10-minute command limit) is not started: wall.json says 'no_time' and the log prints the
#   STAGES= line that runs the rest. With WORK=/tmp/gpu_work (kept between calls on a warm
#   machine) that rerun continues the same profile:
#     WORK=/tmp/gpu_work scripts/gpu_check.sh; then at once WORK=/tmp/gpu_work STAGES="..." scripts/gpu_check.sh
# Budgets (s): preflight 30 (17-19 measured) | gpu_tests 45 (10) | torchrun 45 | bench 60 (30 from empty) | fit 45 (22) |
#   moe_skew 180 | gnn_degree 120 | hf_moe 180 | pyg_conv 120 | moe_design 60 | gemm_same_flops 60 | mlp_batch 45
# experiment=placement is not run: its devices are sets of CPU cores, and one GPU has nothing
# to place across. An experiment whose config is missing from the tree is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY_RUN=${DRY_RUN:-0}
PY=${PY:-python3}
WHEELS=${WHEELS:-$ROOT/.whl}
OUT=${OUT:-$ROOT/gpu_out}
if [ -z "${WORK:-}" ]; then   # staging: packed into $OUT after every stage, removed at the end
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$OUT" "$WORK/logs"
# fitted models are cached per user, never in a profile (costmodel.store.model_cache): here inside
# $WORK (mktemp -d: mode 0700), so they come back in the tarball beside the profile
export MOEGNN_MODEL_CACHE=$WORK/model_cache
LOG=$OUT/gpu_check.log
: > "$LOG"
: > "$WORK/wall.tsv"
say() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# what the GPU run passes to every entry point (composed, not run, in the dry run too)
GPU_COMMON=(device=cuda dtype=bfloat16 "profile.root=$WORK/profiles"
            timing.rounds=2 ++timing.cuda_warmup_ms=5 ++timing.cuda_rep_ms=25)
GPU_BENCH=(suite=quick bench.progress=false)
if [ "$DRY_RUN" = "1" ]; then
  # the same path on the CPU: float32, tiny sizes and timing budgets
  COMMON=(device=cpu dtype=float32 "profile.root=$WORK/profiles" +timing_budget=tiny)  # conf/timing_budget/tiny.yaml
  BENCH=(suite=tiny bench.progress=false)
  # the tiny sizes of each experiment: conf/tiny/NAME.yaml (the tests' tiny forms), selected as +tiny=NAME
  declare -A SIZES=()
  for tiny in conf/tiny/*.yaml; do
    exp=$(basename "$tiny" .yaml); SIZES[$exp]="+tiny=$exp"
  done
else
  COMMON=("${GPU_COMMON[@]}")
  BENCH=("${GPU_BENCH[@]}")
  declare -A SIZES=()
fi
SCALE_BUDGET=${SCALE:-$([ "$DRY_RUN" = "1" ] && echo 3 || echo 1)}   # multiplies every stage budget (the CPU dry run: 3x)
TOTAL_S=${TOTAL_S:-$([ "$DRY_RUN" = "1" ] && echo 100000 || echo 540)}   # no stage starts that would end past this
T0=$(date +%s)
NO_TIME=()

budget() { awk -v b="$1" -v s="$SCALE_BUDGET" 'BEGIN { v = b * s; if (v < 20) v = 20; printf "%d", v }'; }

pack() {  # everything so far -> $OUT (atomic replace), plus the per-stage table
  tar -czf "$OUT/.gpu_results.tar.gz.tmp" -C "$WORK" --exclude site --exclude wall.tsv . 2>>"$LOG" \
    && mv "$OUT/.gpu_results.tar.gz.tmp" "$OUT/gpu_results.tar.gz"
  "$PY" - "$WORK/wall.tsv" "$OUT/wall.json" "$OUT/stages.txt" <<'EOF' 2>>"$LOG" || true
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
stages = [{"stage": s, "status": st, "exit_code": int(rc), "wall_s": float(w), "budget_s": int(b)}
          for s, st, rc, w, b in rows]
total = sum(r["wall_s"] for r in stages)
json.dump({"stages": stages, "total_wall_s": round(total, 1)}, open(sys.argv[2], "w"), indent=2)
with open(sys.argv[3], "w") as f:
    f.write(f"{'stage':<16}{'status':<10}{'wall s':>8}{'budget s':>10}\n")
    for r in stages:
        f.write(f"{r['stage']:<16}{r['status']:<10}{r['wall_s']:>8.1f}{r['budget_s']:>10d}\n")
    f.write(f"{'total':<16}{'':<10}{total:>8.1f}\n")
EOF
}

wanted() { [ -z "${STAGES:-}" ] || [ "$1" = preflight ] || [[ " $STAGES " == *" $1 "* ]]; }

stage() {  # stage NAME BUDGET_S CMD...: run under a time budget, never stop the script
  local name=$1 limit; limit=$(budget "$2"); shift 2
  if ! wanted "$name"; then say "stage $name: not in STAGES, skipped"; return 0; fi
  local left=$(( TOTAL_S - ($(date +%s) - T0) ))
  if [ "$limit" -gt "$left" ]; then
    say "stage $name: not started, its budget ${limit}s is over the ${left}s left of TOTAL_S=${TOTAL_S}"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" no_time -1 0 "$limit" >> "$WORK/wall.tsv"
    NO_TIME+=("$name"); pack; return 0
  fi
  local extra_var="EXTRA_$name"
  if [ -n "${!extra_var:-}" ]; then read -r -a extra <<<"${!extra_var}"; set -- "$@" "${extra[@]}"; fi
  local log="$WORK/logs/$name.log" start end rc status
  say "stage $name (budget ${limit}s): $*"
  start=$(date +%s.%N)
  timeout --signal=INT --kill-after=20 "$limit" "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')" "$limit" >> "$WORK/wall.tsv"
  say "stage $name: $status (exit $rc); last lines:"
  tail -n 15 "$log" | sed 's/^/    /' | tee -a "$LOG"
  pack
  return 0
}

# ------------------------------------------------------------------ set-up: wheels, no index
say "python: $(command -v "$PY"); work dir: $WORK; out: $OUT; dry run: $DRY_RUN"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  say "installing $(ls "$WHEELS"/*.whl | xargs -n1 basename | tr '\n' ' ')from $WHEELS (no index)"
  if ! PIP_NO_INDEX=1 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target "$WORK/site" "$WHEELS"/*.whl >>"$LOG" 2>&1; then
    say "FATAL: installing the carried wheels failed (see above)"; pack; exit 1
  fi
  export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  say "no wheels in $WHEELS (make gpu-wheels here, and carry .whl): using what $PY already has"
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1

# ------------------------------------------------------------------ the committed GPU profile seeds this run's
# (data only: csv and json copied, nothing in it is run); a profile already in $WORK (a rerun with WORK=...) is kept
SEED=${SEED:-$([ "$DRY_RUN" = "1" ] && echo 0 || echo 1)}
if [ "$SEED" = "1" ]; then
  for seed in "$ROOT"/profiles/cuda-*/; do
    [ -f "$seed/fingerprint.json" ] || continue
    dest="$WORK/profiles/$(basename "$seed")"
    if [ -e "$dest" ]; then say "profile $(basename "$seed"): already in $WORK, kept"; continue; fi
    mkdir -p "$dest" && cp "$seed"/*.csv "$seed"/*.json "$dest"/ 2>>"$LOG"
    say "seeded $(basename "$seed") from the tree: $(($(wc -l < "$dest/measurements.csv") - 1)) rows (their kernels are not measured again)"
  done
fi

# ------------------------------------------------------------------ stages
stage preflight 30 "$PY" - "$OUT/env.json" <<'EOF'
"""Every module the project imports, and what this machine is."""
import importlib, json, platform, sys
mods = ["hydra", "omegaconf", "numpy", "scipy", "sklearn", "pandas", "matplotlib", "rich", "pytest", "torch",
        "costmodel.cli.bench_command", "costmodel.cli.fit_command", "sim.api", "experiments.common"]
versions = {m: getattr(importlib.import_module(m), "__version__", "") for m in mods}
import torch
env = {"python": sys.version, "platform": platform.platform(), "versions": versions,
       "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    env.update(device=p.name, capability=list(torch.cuda.get_device_capability(0)), sms=p.multi_processor_count,
               memory_gib=round(p.total_memory / 2**30, 1))
for opt in ("transformers", "torch_geometric", "torch_scatter", "triton"):
    try:
        env["versions"][opt] = importlib.import_module(opt).__version__
    except Exception as err:  # optional: reported, never fatal
        env["versions"][opt] = f"absent ({type(err).__name__})"
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env, indent=2))
EOF
if ! grep -q $'^preflight\tok' "$WORK/wall.tsv"; then
  say "FATAL: preflight failed: the project cannot import here; later stages skipped"; exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
  --format=csv >"$WORK/logs/nvidia_smi.csv" 2>&1

if [ "$DRY_RUN" = "1" ]; then  # the GPU run's own overrides must compose: a typo there would cost a lease
  stage gpu_overrides 20 "$PY" - "${GPU_COMMON[*]}" "${GPU_BENCH[*]}" <<'EOF'
import sys
from pathlib import Path
from hydra import compose, initialize_config_dir
common, bench = sys.argv[1].split(), sys.argv[2].split()
conf = str(Path("conf").resolve())
with initialize_config_dir(config_dir=conf, version_base=None):
    compose("bench", overrides=common + bench)
    compose("fit", overrides=common)
    for exp in sorted(p.stem for p in Path(conf, "experiment").glob("*.yaml")):
        compose("config", overrides=[f"experiment={exp}", *common, "progress=false"])
        print("composes:", exp)
EOF
fi
stage gpu_tests 45 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_path.py
# the EP and partitioned GNN layers under torchrun, one process per GPU under NCCL (the dry run: 2 gloo
# processes), each output checked against the single-device layer
if [ "$DRY_RUN" = "1" ]; then RANKS=2; RANK_DEVICE=cpu; else
  RANKS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); RANKS=$(( RANKS < 1 ? 1 : (RANKS > 8 ? 8 : RANKS) )); RANK_DEVICE=cuda
fi
stage torchrun 45 bash -c "set -e; for s in ep_torchrun gnn_partition_torchrun; do
  \"$PY\" -m torch.distributed.run --nproc_per_node=$RANKS --master_port=\$((29500 + RANDOM % 1000)) \
    scripts/\$s.py --device $RANK_DEVICE --repeats 5 --check --timeout-s 60; done"
stage bench 60 "$PY" -m costmodel bench "${COMMON[@]}" "${BENCH[@]}" "hydra.run.dir=$WORK/bench"
stage fit 45 "$PY" -m costmodel fit "${COMMON[@]}" "hydra.run.dir=$WORK/fit"
declare -A EXP_BUDGET=([moe_skew]=180 [gnn_degree]=120 [hf_moe]=180 [pyg_conv]=120 [moe_design]=60 [gemm_same_flops]=60 [mlp_batch]=45)
# placement is not run here: its devices are sets of CPU cores (one GPU has nothing to place across)
for exp in moe_skew gnn_degree hf_moe pyg_conv moe_design gemm_same_flops mlp_batch; do  # most valuable first
  if [ ! -f "conf/experiment/$exp.yaml" ]; then
    say "stage $exp: no conf/experiment/$exp.yaml in this tree, skipped"; continue
  fi
  if [ "$DRY_RUN" = "1" ] && [ -z "${SIZES[$exp]:-}" ]; then
    say "stage $exp: no tiny sizes for the dry run in this script, skipped"; continue
  fi
  read -r -a sizes <<<"${SIZES[$exp]:-}"
  stage "$exp" "${EXP_BUDGET[$exp]}" "$PY" -m sim "experiment=$exp" "${COMMON[@]}" progress=false "${sizes[@]}" "hydra.run.dir=$WORK/$exp"
done
cp "$LOG" "$WORK/logs/gpu_check.log" 2>/dev/null
pack
say "done: $(grep -c $'\tok\t' "$WORK/wall.tsv") stages ok of $(wc -l < "$WORK/wall.tsv"); outputs in $OUT"
cat "$OUT/stages.txt" | tee -a "$LOG"
if [ ${#NO_TIME[@]} -gt 0 ]; then
  say "not started for lack of time: ${NO_TIME[*]}; at once on the warm machine: WORK=$WORK STAGES=\"${NO_TIME[*]}\" scripts/gpu_check.sh (with WORK set by you, so the profile carries over)"
fi
