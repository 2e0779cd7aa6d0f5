#!/usr/bin/env bash
# The GPU path for real, on a machine with one NVIDIA GPU and ~16 cores, in calls of at
# most 8 minutes each (setup, stage limits and kill grace counted). On the device tool,
# only what a command writes under $OUT comes back (8 files at most), so run it with
#
#   --out "$OUT/gpu"
#
# and it leaves there gpu_check.tar.gz (every stage's log and figures, the search's
# folder without Tune's own; refreshed after each stage, so a call cut short still
# returns what ran) and stages.txt (each stage's time against its limit). The stages
# work in a scratch folder (--work, default a new one under /tmp).
#
# The next device run is two calls, and Ray Data a third on a loan of its own:
#
#   1. bash experiments/gpu_check.sh --out "$OUT/gpu"
#      the first call: the search (resnet50 as people train it on such a card: bf16,
#      channels-last, batch 256; the pipeline searched: PIL, tensor or nvJPEG decoding,
#      uint8 transfer, thread workers; two trials sharing the GPU at 0.5 each, each
#      capped at half its memory; NVML per-process utilization; a window of 32 steps
#      after the drain of what each loader holds) and the bench: the search's winner
#      and both baselines re-measured standalone (python -m raytune_loader.bench, no
#      Ray, the search's steps), in the same session, with the share of the ceiling.
#   2. Bring the first call's archive into the tree (it comes back under files_at:
#      cp <files_at>/gpu/gpu_check.tar.gz results/gpu/first_call.tar.gz), then
#      bash experiments/gpu_check.sh --stages second \
#          --from results/gpu/first_call.tar.gz --out "$OUT/gpu"
#      the second call: every structure of the space measured once (the cost model's
#      best of each, nvJPEG included: structures), --compile backing off from a batch
#      that cannot fit, its recompiles counted (compile_backoff), and two DDP ranks on
#      the one GPU: the backend they join (gloo; NCCL refuses two ranks on one GPU),
#      their ceiling and the rule of thumb per rank (ranks_one_gpu). It keeps room to
#      rerun the bench (--stages second,bench). Its archive holds the first call's files
#      too: unpack it into results/gpu/.
#   3. Ray Data, a call of its own (two full calls leave no device time for it in one loan
#      of 15 minutes: on the loan after them, or as the only call of one):
#      bash experiments/gpu_check.sh --stages raydata --out "$OUT/gpu"
#      a search on a Ray cluster of two nodes on the machine (raydata_scaling): the
#      trial's node held to 4 CPUs with the GPU, a CPU-only node of the 12 other cores for
#      Ray Data's actors; resnet50 in bf16, batch 128; the tuned Ray Data pipeline against
#      the best loader of the 4 CPUs and against decoding on the device (nvJPEG), measured
#      and predicted. It needs ray.data and pyarrow, checked only when it runs: carry
#      pyarrow's wheel in .whl/ for this call.
#
# Other stages, answered in an earlier run or not asked now, by name: precision (the
# ceiling in each precision), decoders_agree (nvJPEG against PIL), limits (the physical
# limit), shared_gpu (two trials sharing the GPU: Kendall tau, NVML per-process vs
# device-wide). --stages takes first, second, raydata, all or names, comma-separated.
#
#   bash experiments/gpu_check.sh --out DIR [--stages NAMES] [--from ARCHIVE|DIR] [--work DIR]
#   bash experiments/gpu_check.sh --dry-run [--out DIR] [--stages NAMES]
#
# --from ARCHIVE|DIR: an earlier call's gpu_check.tar.gz (or its unpacked folder), whose
# search the bench, limits and structures read; not with a search stage of its own.
#
# experiments/gpu_plan.py holds each stage's flags, computes its limit from what it runs
# and the rates the last GPU runs measured (results/gpu/rates.json), and refuses a plan
# whose calls do not fit; it prints each call's total. --dry-run runs every stage's real
# command at tiny sizes on a CPU (a few minutes) with its own dataset cache, results/gpu/
# left alone.
#
# The interpreter is $PYTHON, else python, else python3. The checkout is put on
# PYTHONPATH. Every module the selected stages import (experiments/gpu_modules.py: Ray,
# Optuna, torchdata, threadpoolctl, pynvml...; ray.data and pyarrow for raydata_scaling)
# is checked before the first stage; where one is missing, the wheels in .whl/ are
# installed into /tmp/site: on a machine with a network, download them for the device's
# Python into .whl/ (`pip download --no-deps --only-binary=:all: --python-version 3.12
# -d .whl ray[tune] optuna torchdata==0.11.0 threadpoolctl` and their dependencies, Ray's
# wheel slimmed to travel; pyarrow too for the raydata call) and carry it. TorchCodec is
# left out (its binary follows torch releases): the decoders fall back to torchvision.io.
#
# Each stage has its own time limit and the next stage runs even if one fails, so a
# failure leaves the output of everything before it; the exit status is the first
# failure's. A stage past its limit gets SIGINT (the search's Ctrl-C path), and is
# killed if it has not ended 10 s later.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0 out="" stages_arg="" from="" work=""
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry_run=1 ;;
        --out) out=${2:?--out needs a folder}; shift ;;
        --stages) stages_arg=${2:?--stages needs names}; shift ;;
        --from) from=${2:?--from needs an archive or a folder}; shift ;;
        --work) work=${2:?--work needs a folder}; shift ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$out" ] && [ "$dry_run" -eq 0 ]; then
    if [ -z "${OUT:-}" ]; then
        echo "error: say where the results go: --out \"\$OUT/gpu\" on the device machine (only" \
            "what is under \$OUT comes back), or --out DIR elsewhere (see --help)" >&2
        exit 2
    fi
    out=$OUT/gpu
fi
if [ -n "$from" ] && [ ! -e "$from" ]; then
    echo "error: --from $from does not exist: bring the first call's gpu_check.tar.gz into" \
        "the tree (see --help)" >&2
    exit 2
fi

py=${PYTHON:-}
if [ -z "$py" ]; then
    if command -v python >/dev/null; then py=python; else py=python3; fi
fi
command -v "$py" >/dev/null || { echo "error: no $py on PATH; set PYTHON=" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
site=/tmp/site
checked=${stages_arg:-$([ "$dry_run" -eq 1 ] && echo all || echo first)}  # the plan's default
complete() { "$py" experiments/gpu_modules.py --quiet --stages "$checked" 2>/dev/null; }
if ! complete; then
    export PYTHONPATH="$PYTHONPATH:$site"  # installed there by an earlier run, maybe
    if ! complete; then
        if ! compgen -G '.whl/*.whl' >/dev/null; then
            lacking=$("$py" experiments/gpu_modules.py --stages "$checked" 2>&1 | tail -1)
            echo "error: modules the stages import are not importable by $py${lacking:+ ($lacking)}" \
                "and there is no .whl/ here: download their wheels into .whl/ and carry it (see" \
                "--help)" >&2
            exit 2
        fi
        echo "installing .whl/ into $site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .whl/*.whl || { echo "error: pip could not install .whl/" >&2; exit 2; }
        if ! complete; then
            lacking=$("$py" experiments/gpu_modules.py --stages "$checked" 2>&1 | tail -1)
            echo "error: with .whl/ installed in $site, still $lacking: add their wheels" \
                "(see --help)" >&2
            exit 2
        fi
    fi
fi
# A wheel re-packed without file modes (the slimmed Ray) installs its daemons
# (gcs_server, raylet) without the execute bit: Ray then cannot start.
if [ -d "$site/ray/core/src" ]; then chmod -R a+x "$site/ray/core/src"; fi

work=${work:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
out=${out:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
mkdir -p "$work" "$out"
if [ "$(cd "$work" && pwd -P)" = "$(cd "$out" && pwd -P)" ]; then
    echo "error: --out and --work must be two folders: the archive of one goes in the other" >&2
    exit 2
fi
if [ "$dry_run" -eq 1 ]; then
    export XDG_CACHE_HOME="$work/cache"  # the tiny dataset, not the user's cache
    plan=$("$py" experiments/gpu_plan.py --dry-run ${stages_arg:+--stages "$stages_arg"}) || exit 2
else
    plan=$("$py" experiments/gpu_plan.py ${stages_arg:+--stages "$stages_arg"}) || exit 2
fi
# stages=(...), all_stages=(...), needs_search=(...), kill_after, setup_s; per stage
# NAME=(flags...), limit_NAME, note_NAME
eval "$plan"
selected() { [[ " ${stages[*]} " == *" $1 "* ]]; }
if [ -n "$from" ]; then
    if selected search; then
        echo "error: --from brings an earlier search, which this run's search stage would" \
            "replace: drop --from or the search stage" >&2
        exit 2
    fi
    if [ -d "$from" ]; then cp -R "$from/." "$work/"; else tar -xzf "$from" -C "$work" || exit 2; fi
fi
found=$work/search/synthetic-imagenet

pack() {  # everything but the dataset cache and Tune's folders, as one file under $out,
    # then stages.txt
    tar -czf "$out/gpu_check.tar.gz.part" -C "$work" --exclude=./cache --exclude='./*/*/tune' . &&
        mv "$out/gpu_check.tar.gz.part" "$out/gpu_check.tar.gz"
    cp "$work/stages.txt" "$out/stages.txt"
}

status=0
stage() {  # stage NAME COMMAND...: if selected, run within the plan's limit; log to NAME.log
    local name=$1 started=$SECONDS rc limit_var=limit_$1 note_var=note_$1
    shift
    selected "$name" || return 0
    if [[ " ${needs_search[*]} " == *" $name "* ]] && [ ! -f "$found/best_config.json" ]; then
        echo "== $name: skipped, no search: run it after the search, or with --from the" \
            "first call's gpu_check.tar.gz" | tee -a "$work/stages.txt"
        if [ "$status" -eq 0 ]; then status=1; fi
        pack
        return 0
    fi
    echo "== $name (limit ${!limit_var}s; ${!note_var}): $*"
    timeout --signal=INT --kill-after="$kill_after" "${!limit_var}" "$@" 2>&1 | tee "$work/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started))s (limit ${!limit_var}s; ${!note_var})" |
        tee -a "$work/stages.txt"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    pack
}

echo "# $(date -u +%FT%TZ): ${stages[*]}$([ "$dry_run" -eq 1 ] && echo ' (dry run)')" \
    "${from:+(search from $from)}" >>"$work/stages.txt"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    echo "cpus: $(nproc)"
    free -g | head -2
    df -h /dev/shm | tail -1
    "$py" -c "import torch, torchvision, torchdata, ray, optuna; print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.is_available(), 'torchvision', torchvision.__version__, \
'torchdata', torchdata.__version__, 'ray', ray.__version__, 'optuna', optuna.__version__)"
} > "$work/machine.txt" 2>&1
cat "$work/machine.txt"
echo "== setup: ${SECONDS}s (the module check, wheels, the plan, machine.txt; the plan counts" \
    "${setup_s}s)" | tee -a "$work/stages.txt"
pack

# 0. The step the loader must feed: resnet50's ceiling at batch 256 in each precision.
stage precision env BENCH_DIR="$work" "$py" experiments/precision.py "${precision[@]}"

# 0b. nvJPEG on the GPU against PIL, with the same crop boxes and flips.
stage decoders_agree env BENCH_DIR="$work" "$py" experiments/decoders_agree.py "${decoders_agree[@]}"

# 1. The search, in the defaults a GPU gets (bf16, channels-last, batch 256).
stage search "$py" -m raytune_loader.search "${search[@]}" --out "$work/search"
rm -rf "$found/tune"  # Tune's own folder is large; the CSV, JSON and report stay

# 2. Its winner and both baselines standalone: no Ray, the search's steps.
stage bench "$py" -m raytune_loader.bench --config "$found/best_config.json" \
    --json "$work/bench.json" "${bench[@]}"

# 3. The physical limit: one core's decode, the ceiling, the tuned loader.
stage limits env BENCH_DIR="$work" "$py" experiments/limits.py \
    --config "$found/best_config.json" "${limits[@]}"

# 4. Every structure's best (the cost model's, from the search's profile), each alone.
stage structures env BENCH_DIR="$work" "$py" experiments/structures.py \
    --config "$found/best_config.json" "${structures[@]}"

# 5. --compile backing off from a batch that cannot fit; dynamo's recompiles counted.
stage compile_backoff env BENCH_DIR="$work" "$py" experiments/compile_backoff.py \
    "${compile_backoff[@]}"

# 6. Two DDP ranks on the one GPU: their backend, ceiling and the rule of thumb per rank.
stage ranks_one_gpu env BENCH_DIR="$work" "$py" experiments/ranks_one_gpu.py "${ranks_one_gpu[@]}"

# 7. Four configurations alone, then two at a time at half the GPU each: Kendall tau of
#    the two rankings; NVML per-process vs device-wide utilization while alone.
stage shared_gpu env BENCH_DIR="$work" "$py" experiments/shared_gpu.py "${shared_gpu[@]}"

# 8. Ray Data on two nodes of this machine: the trial's (4 CPUs, the GPU) and a CPU node
#    (12 CPUs, the actors): tuned Ray Data against the 4 CPUs' best loader and nvJPEG.
stage raydata_scaling env BENCH_DIR="$work" "$py" experiments/raydata_scaling.py \
    "${raydata_scaling[@]}" --out "$work/raydata"
rm -rf "$work"/raydata/*/tune

echo "GPU check done (exit $status): $out/gpu_check.tar.gz (the stages' folder: $work)"
if [ "${stages[*]}" = "search bench" ]; then
    echo "next: bring $out/gpu_check.tar.gz into the tree (results/gpu/first_call.tar.gz)" \
        "and run: bash experiments/gpu_check.sh --stages second" \
        "--from results/gpu/first_call.tar.gz --out \"\$OUT/gpu\""
fi
exit "$status"
