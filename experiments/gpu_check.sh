#!/usr/bin/env bash
# The GPU path for real, on a machine with one NVIDIA GPU and ~16 cores, in at most
# 8 minutes of stage limits: the ceilings of resnet50 in fp32, TF32, bf16 and bf16 +
# channels-last side by side; whether nvJPEG's images match PIL's; the search on
# synthetic-imagenet with resnet50 as people train it on such a card (bf16 autocast,
# channels-last, batch 256; the pipeline searched too: PIL, tensor or nvJPEG decoding,
# uint8 transfer, thread workers; objective samples/s; NVML per-process utilization,
# two trials sharing the GPU at 0.5 each, every measurement capped at half its memory,
# the OOM back-off forced by a batch size that cannot fit in that half; the input
# pipeline alone in best_config.json's limit section; the tuned loader against both
# baselines in its verification); the ranking two-at-a-time vs alone (Kendall tau) and
# NVML per-process vs device-wide. Everything lands in results/gpu/.
#
# Three more stages do not fit in the same 8 minutes: the baselines benchmark (tuned vs
# heuristic in interleaved rounds, target >= 1.5x), the limits benchmark (both read
# the search's best_config.json) and a search with two DDP ranks per trial sharing the
# GPU. Run them in a second session, after this one's search:
#
#   bash experiments/gpu_check.sh                      the default stages
#   bash experiments/gpu_check.sh --stages baselines,limits,ranks
#   bash experiments/gpu_check.sh --dry-run [--out DIR]
#
# experiments/gpu_plan.py holds each stage's flags and computes its limit from what the
# stage runs and the rates the last GPU run measured (results/gpu/rates.json); each
# stage prints its limit, estimate and margin, and stages.txt keeps them beside the time
# it took. --dry-run runs every stage's real command at tiny sizes on a CPU (a few
# minutes), into a scratch folder (--out, default a new one under /tmp) with its own
# dataset cache, leaving results/gpu/ alone.
#
# The interpreter is $PYTHON, else python, else python3. The checkout is put on
# PYTHONPATH. Where Ray or Optuna is not importable (the GPU image lacks them), the
# wheels in .whl/ are installed into /tmp/site: download them on a machine with a
# network for the GPU machine's Python (`pip download --only-binary=:all:
# --python-version 3.12 -d .whl ray[tune] optuna torchdata` and their dependencies)
# and bring .whl/ along. TorchCodec is left out (its binary follows torch releases):
# the decoders fall back to torchvision.io.
#
# Each stage has its own time limit and the next stage runs even if one fails, so a
# failure leaves the output of everything before it; the exit status is the first
# failure's. A stage past its limit gets SIGINT, the search's Ctrl-C path.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0 out="" stages_arg=""
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry_run=1 ;;
        --out) out=${2:?--out needs a folder}; shift ;;
        --stages) stages_arg=${2:?--stages needs names}; shift ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

py=${PYTHON:-}
if [ -z "$py" ]; then
    if command -v python >/dev/null; then py=python; else py=python3; fi
fi
command -v "$py" >/dev/null || { echo "error: no $py on PATH; set PYTHON=" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
site=/tmp/site
importable() { "$py" -c 'import ray, optuna' 2>/dev/null; }
if ! importable; then
    export PYTHONPATH="$PYTHONPATH:$site"  # installed there by an earlier run, maybe
    if ! importable; then
        if ! compgen -G '.whl/*.whl' >/dev/null; then
            echo "error: Ray or Optuna is not importable by $py and there is no .whl/ here:" \
                "download their wheels into .whl/ (see --help)" >&2
            exit 2
        fi
        echo "installing .whl/ into $site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .whl/*.whl || { echo "error: pip could not install .whl/" >&2; exit 2; }
        importable || { echo "error: Ray or Optuna is still not importable from $site" >&2; exit 2; }
    fi
fi
# A wheel re-packed without file modes (the slimmed Ray) installs its daemons
# (gcs_server, raylet) without the execute bit: Ray then cannot start.
if [ -d "$site/ray/core/src" ]; then chmod -R a+x "$site/ray/core/src"; fi

if [ "$dry_run" -eq 1 ]; then
    out=${out:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
    export XDG_CACHE_HOME="$out/cache"  # the tiny dataset, not the user's cache
    plan=$("$py" experiments/gpu_plan.py --dry-run ${stages_arg:+--stages "$stages_arg"}) || exit 2
else
    out=${out:-results/gpu}
    plan=$("$py" experiments/gpu_plan.py ${stages_arg:+--stages "$stages_arg"}) || exit 2
fi
eval "$plan"  # stages=(...), all_stages=(...), per stage NAME=(flags...), limit_NAME, note_NAME
selected() { [[ " ${stages[*]} " == *" $1 "* ]]; }
mkdir -p "$out"
# A new search makes every output of an earlier run stale; without one (a second
# session), only the stages run now are redone. README.md, rates.json and the history
# in stages.txt stay.
if selected search; then clear=("${all_stages[@]}"); else clear=("${stages[@]}"); fi
for name in "${clear[@]}"; do rm -rf "${out:?}/$name" "$out/$name.log" "$out/$name.json"; done
status=0
stage() {  # stage NAME COMMAND...: if selected, run within the plan's limit; log to $out/NAME.log
    local name=$1 started=$SECONDS rc limit_var=limit_$1 note_var=note_$1
    shift
    selected "$name" || return 0
    echo "== $name (limit ${!limit_var}s; ${!note_var}): $*"
    timeout --signal=INT --kill-after=20 "${!limit_var}" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started))s (limit ${!limit_var}s; ${!note_var})" |
        tee -a "$out/stages.txt"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

echo "# $(date -u +%FT%TZ): ${stages[*]}$([ "$dry_run" -eq 1 ] && echo ' (dry run)')" >>"$out/stages.txt"
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

# 0. The step the loader must feed: resnet50's ceiling at batch 256 in each precision.
stage precision env BENCH_DIR="$out" "$py" experiments/precision.py "${precision[@]}"

# 0b. nvJPEG on the GPU against PIL, with the same crop boxes and flips.
stage decoders_agree env BENCH_DIR="$out" "$py" experiments/decoders_agree.py "${decoders_agree[@]}"

# 1. The search, in the defaults a GPU gets (bf16, channels-last). Batch 2048 of
#    resnet50 needs more than half of an H200 (the cap of a 0.5-GPU trial), so it backs
#    off; 256 fits. Every stage reads the one dataset the plan sizes for it.
stage search "$py" -m raytune_loader.search "${search[@]}" --out "$out/search"
found=$out/search/synthetic-imagenet
rm -rf "$found/tune"  # Tune's own folder is large; the CSV, JSON and report stay

# 2. Benchmarks 1 (tuned vs the usual choices) and 4 (the physical limit) on the GPU.
if [ -f "$found/best_config.json" ]; then
    stage baselines env BENCH_DIR="$out" "$py" experiments/baselines.py \
        --config "$found/best_config.json" "${baselines[@]}"
    stage limits env BENCH_DIR="$out" "$py" experiments/limits.py \
        --config "$found/best_config.json" "${limits[@]}"
elif selected baselines || selected limits; then
    echo "no $found/best_config.json: baselines and limits skipped" | tee -a "$out/stages.txt"
    if [ "$status" -eq 0 ]; then status=1; fi
fi

# 3. Four configurations alone, then two at a time at half the GPU each: Kendall tau of
#    the two rankings; NVML per-process vs device-wide utilization while alone.
stage shared_gpu env BENCH_DIR="$out" "$py" experiments/shared_gpu.py "${shared_gpu[@]}"

# 4. Two data-parallel ranks sharing the one GPU (gloo), every trial's loader per rank:
#    the --ranks-per-node smoke test (results/gpu/ranks/).
stage ranks "$py" -m raytune_loader.search "${ranks[@]}" --out "$out/ranks"
rm -rf "$out/ranks/synthetic-imagenet/tune"

echo "GPU check done (exit $status): $out"
left=()
for name in "${all_stages[@]}"; do selected "$name" || left+=("$name"); done
if [ "${#left[@]}" -gt 0 ]; then
    again="bash experiments/gpu_check.sh$([ "$dry_run" -eq 1 ] && echo ' --dry-run')"
    echo "not run: ${left[*]} ($again --stages $(IFS=,; echo "${left[*]}"))"
fi
exit "$status"
