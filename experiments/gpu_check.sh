#!/usr/bin/env bash
# The GPU path for real, on a machine with one NVIDIA GPU and ~16 cores, in at most
# ~8 minutes: the search on synthetic-imagenet with resnet50 on CUDA (NVML per-process
# utilization, fractional GPUs), the OOM back-off forced by a batch size that cannot
# fit, then the baselines and limits benchmarks. Everything lands in results/gpu/.
#
#   bash experiments/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/gpu
mkdir -p "$out"
python -m pip install --quiet -e . 2>/dev/null || true
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not found" > "$out/nvidia-smi.txt"
python -c "import torch; print('cuda', torch.cuda.is_available(), torch.version.cuda)" | tee "$out/torch.txt"

# 1. The search: batch 4096 cannot fit next to another trial on one GPU, so it backs off.
timeout 300 python -m raytune_loader.search --synthetic-images 4000 --num-samples 12 \
    --time-budget 150 --batch-sizes 256,4096 --min-batch-size 64 --gpus-per-trial 0.5 \
    --steps 40 --warmup-steps 5 --verify-top 2 --verify-repeats 2 --out "$out/search" \
    2>&1 | tee "$out/search.log"

# 2. Benchmarks 1 (tuned vs the usual choices) and 4 (the physical limit) on the GPU.
config="$out/search/synthetic-imagenet/best_config.json"
BENCH_DIR="$out" timeout 150 python experiments/baselines.py --config "$config" --repeats 3 \
    2>&1 | tee "$out/baselines.log"
BENCH_DIR="$out" timeout 90 python experiments/limits.py --config "$config" \
    2>&1 | tee "$out/limits.log"
rm -rf "$out/search/synthetic-imagenet/tune"  # Tune's folder is large; the CSV/JSON stay
echo "GPU check done: $out"
