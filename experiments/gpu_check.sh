#!/usr/bin/env bash
# The GPU path for real, on a machine with one NVIDIA GPU and ~16 cores, in about
# 7 minutes (the stage limits add up to 8): the ceilings of resnet50 in fp32, TF32, bf16
# and bf16 + channels-last side by side; whether nvJPEG's images match PIL's; the search
# on synthetic-imagenet with resnet50 as people train it on such a card (bf16 autocast,
# channels-last, batch 256; the pipeline searched too: PIL, tensor or nvJPEG decoding,
# uint8 transfer, thread workers; objective samples/s; NVML per-process utilization,
# two trials sharing the GPU at 0.5 each, every measurement capped at half its memory,
# the OOM back-off forced by a batch size that cannot fit in that half; the input
# pipeline alone in best_config.json's limit section); then the baselines (target:
# tuned >= 1.5x heuristic) and limits benchmarks; the ranking two-at-a-time vs alone
# (Kendall tau) and NVML per-process vs device-wide; a search with two DDP ranks per
# trial sharing the GPU. Everything lands in results/gpu/.
#
#   bash experiments/gpu_check.sh          (PYTHON=python3.12 to pick the interpreter)
#
# The device lacks Ray, Optuna and torchdata: build them with
# `../shared/device/wheels.sh torchdata` and carry .whl (see its header). TorchCodec is
# left out (its binary follows torch releases): the decoders fall back to torchvision.io.
#
# Each stage has its own time limit and the next stage runs even if one fails, so a
# failure leaves the output of everything before it; the exit status is the first
# failure's. A stage past its limit gets SIGINT, the search's Ctrl-C path.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=results/gpu
mkdir -p "$out"
# the last run's outputs go; results/gpu/README.md (the write-up of a run) stays
rm -rf "$out/search" "$out/ranks" "$out"/*.log "$out"/*.json "$out"/*.txt
status=0
stage() {  # stage NAME LIMIT_S COMMAND...: run, log to $out/NAME.log, keep the first failure
    local name=$1 limit=$2 started=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit}s): $*"
    timeout --signal=INT --kill-after=20 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started))s" | tee -a "$out/stages.txt"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    echo "cpus: $(nproc)"
    free -g | head -2
    df -h /dev/shm | tail -1
    "$py" -c "import torch, torchvision, ray, optuna; print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.is_available(), 'torchvision', torchvision.__version__, \
'ray', ray.__version__, 'optuna', optuna.__version__)"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

# 0. The step the loader must feed: resnet50's ceiling at batch 256 in each precision
#    (results/gpu/precision.json), one window of 20 steps, 2 rounds.
stage precision 25 env BENCH_DIR="$out" "$py" experiments/precision.py --rounds 1 --steps 10

# 0b. nvJPEG on the GPU against PIL, with the same crop boxes and flips.
stage decoders 15 env BENCH_DIR="$out" "$py" experiments/decoders_agree.py --samples 16

# 1. The search, in the defaults a GPU gets (bf16, channels-last). Batch 2048 of
#    resnet50 needs more than half of an H200 (the cap of a 0.5-GPU trial), so it backs
#    off; 256 fits. The benchmarks below read the same embedded dataset.
stage search 170 "$py" -m raytune_loader.search --samples-per-trial 2048 \
    --batch-sizes 256,2048 --min-batch-size 128 --gpus-per-trial 0.5 --num-samples 10 \
    --time-budget 70 --steps 20 --report-every 10 --warmup-steps 3 --verify-top 1 \
    --verify-repeats 1 --out "$out/search"
found=$out/search/synthetic-imagenet
rm -rf "$found/tune"  # Tune's own folder is large; the CSV, JSON and report stay

# 2. Benchmarks 1 (tuned vs the usual choices) and 4 (the physical limit) on the GPU.
if [ -f "$found/best_config.json" ]; then
    stage baselines 85 env BENCH_DIR="$out" "$py" experiments/baselines.py \
        --config "$found/best_config.json" --repeats 2 --steps 20
    stage limits 30 env BENCH_DIR="$out" "$py" experiments/limits.py \
        --config "$found/best_config.json" --steps 20
else
    echo "no best_config.json: benchmarks skipped" | tee -a "$out/stages.txt"
fi

# 3. Six configurations alone, then two at a time at half the GPU each: Kendall tau of
#    the two rankings; NVML per-process vs device-wide utilization while alone.
stage shared_gpu 80 env BENCH_DIR="$out" "$py" experiments/shared_gpu.py --steps 15

# 4. Two data-parallel ranks sharing the one GPU (gloo), every trial's loader per rank:
#    the --ranks-per-node smoke test (results/gpu/ranks/).
stage ranks 60 "$py" -m raytune_loader.search --ranks-per-node 2 --gpus-per-trial 1 \
    --batch-size 128 --samples-per-trial 1024 --num-samples 3 --time-budget 30 --steps 10 \
    --report-every 5 --warmup-steps 2 --verify-top 1 --verify-repeats 1 --out "$out/ranks"
rm -rf "$out/ranks/synthetic-imagenet/tune"

echo "GPU check done (exit $status): $out"
exit "$status"
