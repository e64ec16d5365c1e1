#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one run, most important first, each under its own
# time limit so that one slow measurement does not cost the rest:
#   1. the paper's step (ResNet-18, batch 256, T = 100), fp32, against the eager PyTorch peer on
#      the same GPU, arms alternating (compare_torch.py), then bf16;
#   2. evaluation rates (PR at N = 100 and 4 epsilons, PGD-20), ResNet-18;
#   3. the cheaper sampler (start at x, T = 20) and WRN-50-2 at batch 256, T = 100.
# One JSON line per measurement goes to $OUT/gpu.jsonl, everything printed to $OUT/log.txt, the
# machine's description to $OUT/env.txt.
#
#   OUT=gpu_out bash benchmarks/gpu_measurements.sh
#   # a dry run of the same commands on small settings (CPU):
#   OUT=/tmp/gpu_dry MODEL=small_cnn WIDE=small_cnn BATCH=16 T=2 EVAL_BATCH=16 PR_N=4 ITERS=1 \
#     bash benchmarks/gpu_measurements.sh
set -u
OUT=${OUT:-gpu_out}
MODEL=${MODEL:-resnet18}
WIDE=${WIDE:-wrn50_2}
BATCH=${BATCH:-256}
T=${T:-100}
EVAL_BATCH=${EVAL_BATCH:-500}
PR_N=${PR_N:-100}
ITERS=${ITERS:-4}
# Dense peaks of an H100 SXM (NVIDIA's datasheet): TF32 494.7, BF16 989.4 TFLOP/s. fp32 convolutions
# run as TF32 on tensor cores in both JAX (default precision) and PyTorch (cudnn.allow_tf32).
PEAK_TF32=${PEAK_TF32:-494700}
PEAK_BF16=${PEAK_BF16:-989400}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# A fresh cache per run: repeated programs (the second patjax arm of compare_torch) load from it,
# and each measurement's first compile_s is a true compile, not a load left by an earlier run.
export JAX_COMPILATION_CACHE_DIR=$(mktemp -d)

{
  date -u
  nvidia-smi -L 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
  python3 - <<'EOF'
import importlib.metadata as md, platform
print("python", platform.python_version())
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "torch"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        pass
import jax
print("jax devices", jax.devices(), "default_matmul_precision", jax.config.jax_default_matmul_precision)
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

measure() { # NAME SECONDS COMMAND...: the command's output to the log, its JSON lines to gpu.jsonl
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$OUT/log.txt"
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/.current" 2>&1
  local rc=$?
  cat "$OUT/.current" >> "$OUT/log.txt"
  grep '^{' "$OUT/.current" | sed "s/^{/{\"measurement\": \"$name\", /" >> "$OUT/gpu.jsonl"
  tail -3 "$OUT/.current"
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/log.txt"
  rm -f "$OUT/.current"
  return $rc
}

B=benchmarks
# A small step first: if patjax cannot run here, stop at once rather than after every limit.
measure smoke 120 python3 $B/epoch_throughput.py --model small_cnn --batch 32 --langevin-steps 2 --iters 1 --no-flops --json || exit 1
measure step_fp32_vs_peer 240 python3 $B/compare_torch.py --model "$MODEL" --batch "$BATCH" --langevin-steps "$T" \
  --iters "$ITERS" --rounds 2 --peak-gflops "$PEAK_TF32" --json
measure step_bf16 100 python3 $B/epoch_throughput.py --model "$MODEL" --batch "$BATCH" --langevin-steps "$T" \
  --iters "$ITERS" --compute-dtype bfloat16 --peak-gflops "$PEAK_BF16" --json
measure eval_rates 150 python3 $B/eval_throughput.py --model "$MODEL" --batch "$EVAL_BATCH" --batches 1 5 \
  --pr-samples "$PR_N" --json
measure step_cheaper_sampler 80 python3 $B/epoch_throughput.py --model "$MODEL" --batch "$BATCH" --langevin-steps 20 \
  --langevin-init clean --iters "$ITERS" --peak-gflops "$PEAK_TF32" --json
measure step_wide 150 python3 $B/epoch_throughput.py --model "$WIDE" --batch "$BATCH" --langevin-steps "$T" \
  --iters 2 --peak-gflops "$PEAK_TF32" --json
echo "done $(date -u +%T)" | tee -a "$OUT/log.txt"
