# Shared by the GPU scripts (sourced; OUT set): the output folder, the environment, a fresh JAX
# compilation cache, the machine's description in $OUT/env.txt, and `measure`.
mkdir -p "$OUT"
# Dense peaks of an H100 SXM (NVIDIA's datasheet): TF32 494.7, BF16 989.4 TFLOP/s. fp32 convolutions
# run as TF32 on tensor cores in both JAX (default precision) and PyTorch (cudnn.allow_tf32).
PEAK_TF32=${PEAK_TF32:-494700}
PEAK_BF16=${PEAK_BF16:-989400}
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

