#!/bin/bash
# The prepared GPU check on a lent GPU machine (tools/gpu_check.py): the device tool runs, from the repository root,
#   OUT=$OUT bash tools/gpu_check.sh          (carry: .gpu, made here by python -m tools.gpu_check pack .gpu)
# What travels (the tracked tree and .gpu) must stay under 64 MiB: move neuroshard_jax/data/profiles (55 MB of labels)
# aside for the call, all but h200-queued-run1..3 (3.4 MB: the model step trains on them beside the run's labels;
# without them it trains on the run's alone).
# The machine has python3, torch, jax, flax, optax, orbax, numpy, scipy; it lacks FBGEMM GPU, hydra, TorchRec and the
# project: they come unpacked from .gpu (TorchRec 1.6.1 and what it imports, for the DMP step), and the project is
# copied with conf/ inside the package (as the wheel ships it).
set -euo pipefail
REPO=$(pwd); OUT=${OUT:?set OUT to the folder that comes back}; SITE=/tmp/nsj-site; PROJ=/tmp/nsj-proj
mkdir -p "$SITE" "$PROJ" "$OUT"
tar -xJf .gpu/fbgemm-sm90.tar.xz -C "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/whl/*.whl
tar -xzf .gpu/whl/antlr4-python3-runtime-4.9.3.tar.gz -C /tmp
cp -r /tmp/antlr4-python3-runtime-4.9.3/src/antlr4 "$SITE/"
cp -r neuroshard_jax searchers tools "$PROJ/" && cp -r conf "$PROJ/neuroshard_jax/conf"
cd "$PROJ"
# JAX on the host CPU (training, search): the GPU measures kernels alone. The tasks' streams go to the cache (~15 GB).
export PYTHONPATH="$PROJ:$SITE" CUDA_MODULE_LOADING=LAZY XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 \
  JAX_PLATFORMS=cpu NEUROSHARD_CACHE_DIR=/tmp/nsj-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv || true
# the device tool brings back 8 files at most: on exit, everything in one archive beside the four read first
keep_eight() {
  (cd "$OUT" && tar czf /tmp/nsj-results.tgz --exclude results.tgz . && mv /tmp/nsj-results.tgz results.tgz \
    && find . -maxdepth 1 -type f ! -name results.tgz ! -name table.md ! -name plans.json ! -name log.txt -delete) \
    || true
}
trap keep_eight EXIT
status=0
python3 -m tools.gpu_check run "$OUT" --pack "$REPO/.gpu" --budget-s "${BUDGET_S:-450}" --steps "${STEPS:-}" \
  --label-seed "${LABEL_SEED:-0}" || status=$?
python3 -m tools.gpu_check table "$OUT" > "$OUT/table.md" || true   # what the steps that ran wrote
cat "$OUT/table.md"
exit $status
