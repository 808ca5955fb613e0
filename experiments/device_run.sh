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
if [ "${LLM_ONLY:-0}" != 1 ]; then  # the kernels, the update step and the rollout loops (measured 2026-11-29)
if [ "$QUICK" = 1 ]; then  # a dry run of the same script at tiny sizes (CPU)
  A="--groups 16 --variants grpo,gigpo,hgpo --python-max-groups 0"; E="--groups 8 --repeats 1"; S="--scale cpu"; BK=""
else
  A="--groups 16,256,3072,12288 --python-max-groups 0 --dense-max-groups 256"; E="--groups 8,256 --repeats 2"; S="--scale gpu"; BK=""  # JAX picks the GPU itself
fi
timeout ${T_ADV:-140} $PY -m experiments.bench_advantages $BK $A --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_advantages rc=$?"
timeout ${T_TRAIN:-160} $PY -m experiments.bench_train_step $BK $S --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_train_step rc=$?"
timeout ${T_ENV:-90} $PY -m experiments.bench_env_loop $BK $E --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_env_loop rc=$?"
fi
# The pretrained-model part, where the model file is on the machine: MODEL = the path of SmolLM2-135M-Instruct's
# GGUF file (bepo-jax models fetch smollm2-135m prints it; the device machine has no network, so copy it there
# first), GAMES = a folder of pre-generated TextWorld games to start the runs' game cache with (the games are
# generated with TextWorld's Inform 7 compiler otherwise), TORCH_PY = an interpreter with torch + transformers
# for the reference rows (default: $PY), LLM_ONLY=1 to skip the kernels above.
if [ -n "${MODEL:-}" ] && [ -f "$MODEL" ]; then
  if [ "$QUICK" = 1 ]; then L="--quick --repeats 1"; TD=cpu; R="--groups 1 --group-size 2 --iterations 1 --eval-tasks 1 --max-reply 4"; R2="$R"; GA=1
  else L="--repeats 3"; TD=cuda; R="--groups 8 --group-size 8 --iterations 4 --eval-every 4 --eval-tasks 8"; R2="--iterations 3 --eval-tasks 2"; GA=8; fi
  timeout ${T_LLM:-180} $PY -m experiments.bench_llm --model "$MODEL" $L --torch-python "${TORCH_PY:-$PY}" \
    --torch-device "${TORCH_DEVICE:-$TD}" --out "$OUT" >> "$OUT/run.log" 2>&1; echo "bench_llm rc=$?"
  # The LLM recipe (bepo-jax train --recipe llm_textworld) twice: at a GPU's batch (8 games x 8 episodes, LoRA on
  # every projection of all 30 blocks instead of the CPU's top 2 blocks), and as the CPU runs it (2 x 4, top 2
  # blocks) for the same iteration on both machines. The run directories stay on the machine (only 8 files come
  # back from $OUT); their metrics.jsonl (per-iteration seconds split between decoding, games and the update) and
  # config.json are copied to $OUT.
  RUNS=${RUNS:-/tmp/bepo_device_runs}; mkdir -p "$RUNS/.textworld_games"
  if [ -n "${GAMES:-}" ]; then cp "$GAMES"/* "$RUNS/.textworld_games/"; fi
  timeout ${T_LLM_TRAIN:-200} $PY -m bepo_jax.cli train --recipe llm_textworld --model "$MODEL" $R --train-layers 0 \
    --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --grad-accum $GA --quiet \
    --out "$RUNS/lora_8x8" >> "$OUT/run.log" 2>&1; echo "llm_textworld lora_8x8 rc=$?"
  timeout ${T_LLM_CPU:-110} $PY -m bepo_jax.cli train --recipe llm_textworld --model "$MODEL" $R2 --quiet \
    --out "$RUNS/recipe_2x4" >> "$OUT/run.log" 2>&1; echo "llm_textworld recipe_2x4 rc=$?"
  for r in lora_8x8 recipe_2x4; do
    cat "$RUNS/$r/config.json" > "$OUT/llm_${r}_config.json" 2>/dev/null
    cat "$RUNS/$r/metrics.jsonl" > "$OUT/llm_${r}_metrics.jsonl" 2>/dev/null
  done
else
  echo "bench_llm and llm_textworld skipped: set MODEL to the GGUF file of smollm2-135m"
fi
tail -n 40 "$OUT/run.log"
