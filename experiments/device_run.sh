#!/usr/bin/env bash
# One device session: kernels, rollout loops and the update step on the accelerator.
# Usage (on a GPU machine with JAX installed, from the repository root):
#   OUT=experiments/results/gpu experiments/device_run.sh
# Each benchmark has its own time limit; each writes its json/md to $OUT as it goes.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:$PWD"
PY=${PY:-python3}
OUT=${OUT:-experiments/results/gpu}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/device.txt"
$PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" | tee -a "$OUT/device.txt"
if [ "$QUICK" = 1 ]; then  # a dry run of the same script at tiny sizes (CPU)
  A="--groups 16 --variants grpo,gigpo,hgpo --python-max-groups 0"; E="--groups 8 --repeats 1"; S="--scale cpu"; BK=""
else
  A="--groups 16,256,3072,12288 --python-max-groups 0 --dense-max-groups 256"; E="--groups 8,256 --repeats 2"; S="--scale gpu"; BK=""  # JAX picks the GPU itself
fi
timeout ${T_ADV:-140} $PY -m experiments.bench_advantages $BK $A --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_advantages rc=$?"
timeout ${T_TRAIN:-160} $PY -m experiments.bench_train_step $BK $S --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_train_step rc=$?"
timeout ${T_ENV:-90} $PY -m experiments.bench_env_loop $BK $E --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_env_loop rc=$?"
# The pretrained-model table (experiments/bench_llm.py) where the model file is on the machine: MODEL=path of
# SmolLM2-135M-Instruct's GGUF file (bepo-jax models fetch smollm2-135m prints it; the device machine has no
# network, so copy it there first).
if [ -n "${MODEL:-}" ] && [ -f "$MODEL" ]; then
  timeout ${T_LLM:-240} $PY -m experiments.bench_llm --model "$MODEL" --repeats 2 --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_llm rc=$?"
  # The LLM recipe (bepo-jax train --recipe llm_textworld) at a GPU's batch: 8 games x 8 episodes, LoRA on every
  # projection of all 30 blocks instead of the CPU's top 2 blocks; per-iteration seconds split between decoding,
  # games and the update land in $OUT/llm_textworld/metrics.jsonl (needs textworld on the machine).
  timeout ${T_LLM_TRAIN:-300} $PY -m bepo_jax.cli train --recipe llm_textworld --model "$MODEL" --groups 8 \
    --group-size 8 --iterations 4 --eval-every 4 --eval-tasks 8 --train-layers 0 --lora-rank 16 \
    --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --grad-accum 8 --quiet \
    --out "$OUT/llm_textworld" >> "$OUT/run.log" 2>&1; echo "llm_textworld rc=$?"
else
  echo "bench_llm and llm_textworld skipped: set MODEL to the GGUF file of smollm2-135m"
fi
tail -n 40 "$OUT/run.log"
