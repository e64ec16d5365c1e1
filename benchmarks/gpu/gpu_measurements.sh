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
#   OUT=gpu_out bash benchmarks/gpu/gpu_measurements.sh
#   # a dry run of the same commands on small settings (CPU):
#   OUT=/tmp/gpu_dry MODEL=small_cnn WIDE=small_cnn BATCH=16 T=2 EVAL_BATCH=16 PR_N=4 ITERS=1 \
#     bash benchmarks/gpu/gpu_measurements.sh
set -u
OUT=${OUT:-gpu_out}
MODEL=${MODEL:-resnet18}
WIDE=${WIDE:-wrn50_2}
BATCH=${BATCH:-256}
T=${T:-100}
EVAL_BATCH=${EVAL_BATCH:-500}
PR_N=${PR_N:-100}
ITERS=${ITERS:-4}
. "$(dirname "$0")/gpu_common.sh"

B=benchmarks/speed
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
