#!/usr/bin/env bash
# The GPU-speed figures of docs/performance.md ("GPU profile and compiled peer") in one run, as
# stages chosen by STAGES (default: all, in this order), each under its own time limit:
#   profile  the paper's step (ResNet-18, batch 256, T = 100) traced with jax.profiler, fp32 and
#            bf16: $OUT/profile_{fp32,bf16}.json (summaries) and the printed tables in the log;
#   peer     patjax against the eager and the compiled PyTorch peer, fp32, arms alternating;
#   peer_bf16  patjax bf16 against the compiled peer under bf16 autocast, alternating;
#   flags    patjax arms under the XLA flags and precisions of docs/performance.md's candidate
#            list, alternating with the default step (ratios to it);
#   peer_cudagraphs  (not in the default list) the compiled peer with CUDA graphs against without.
# JSON lines to $OUT/gpu.jsonl, everything printed to $OUT/log.txt, the machine in $OUT/env.txt
# (benchmarks/gpu/gpu_common.sh). Run from the repository root or a staged copy of patjax/,
# patjax_torch/ and benchmarks/.
#
#   OUT=gpu_out bash benchmarks/gpu/gpu_profile.sh
#   OUT=gpu_out STAGES="peer_bf16 flags" bash benchmarks/gpu/gpu_profile.sh
#   # the same commands on a CPU, small (a dry run of every stage):
#   OUT=/tmp/gpu_dry MODEL=small_cnn BATCH=8 T=1 ITERS=1 ROUNDS=1 bash benchmarks/gpu/gpu_profile.sh
set -u
OUT=${OUT:-gpu_out}
MODEL=${MODEL:-resnet18}
BATCH=${BATCH:-256}
T=${T:-100}
ITERS=${ITERS:-3}
ROUNDS=${ROUNDS:-2}
STAGES=${STAGES:-profile peer peer_bf16 flags}
. "$(dirname "$0")/gpu_common.sh"

B=benchmarks/speed
SIZE=(--model "$MODEL" --batch "$BATCH" --langevin-steps "$T")
COMPILED="--compile --channels-last"
for stage in $STAGES; do
  case $stage in
    profile)
      for pair in fp32:float32 bf16:bfloat16; do
        measure "profile_${pair%%:*}" 110 python3 $B/profile_step.py "${SIZE[@]}" --compute-dtype "${pair#*:}" \
          --warmup 2 --top 15 --out "$OUT/profile_${pair%%:*}.json"
      done
      ;;
    peer)
      measure peer_fp32 320 python3 $B/compare_torch.py "${SIZE[@]}" --iters "$ITERS" --rounds "$ROUNDS" \
        --peer-variant= --peer-variant="$COMPILED --check-steps 3" --peak-gflops "$PEAK_TF32" --json
      ;;
    peer_bf16)
      measure peer_bf16 300 python3 $B/compare_torch.py "${SIZE[@]}" --iters "$ITERS" --rounds "$ROUNDS" \
        --peer-variant="$COMPILED --compute-dtype bfloat16 --check-steps 3" \
        --patjax-variant="--compute-dtype bfloat16" --peak-gflops "$PEAK_BF16" --json
      ;;
    flags)
      # The candidates of docs/performance.md, each an arm against the default step (the first).
      measure xla_flags 540 python3 $B/compare_torch.py "${SIZE[@]}" --iters "$ITERS" --rounds "$ROUNDS" --no-peer \
        --patjax-variant= \
        --patjax-variant="XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=true'" \
        --patjax-variant="XLA_FLAGS='--xla_gpu_enable_command_buffer='" \
        --patjax-variant="XLA_FLAGS='--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,WHILE,CONDITIONAL'" \
        --patjax-variant="XLA_FLAGS='--xla_gpu_autotune_level=0'" \
        --patjax-variant="XLA_FLAGS='--xla_gpu_triton_gemm_any=true'" \
        --patjax-variant="--conv-input-grad reordered" \
        --peak-gflops "$PEAK_TF32" --json
      ;;
    peer_cudagraphs)
      # The compiled peer with CUDA graphs (torch.compile mode reduce-overhead) against the default.
      measure peer_cudagraphs 300 python3 $B/compare_torch.py "${SIZE[@]}" --iters "$ITERS" --rounds "$ROUNDS" \
        --peer-variant="$COMPILED" --peer-variant="$COMPILED --compile-mode reduce-overhead --check-steps 3" --json
      ;;
    *) echo "unknown stage $stage" | tee -a "$OUT/log.txt" ;;
  esac
done
echo "done $(date -u +%T)" | tee -a "$OUT/log.txt"
