#!/usr/bin/env bash
# The GPU checks of simctl issues 26 and 41, as one device call: `bash bench/gpu_checks.sh STAGE...` on a
# machine with a CUDA GPU and the image's torch/transformers, from the repository root, simpy carried as a
# wheel in .whl/ (the device tool's README says how). Each stage runs under its own time limit, so one that
# fails or hangs leaves the others; logs and outputs land in $OUT/gpu (tarred into $OUT/gpu.tgz after every
# stage: a call stopped at its limit still brings back what had finished).
#
#   stages: env tests floor profile validate kernels protocols   (run in the order given)
# Next on an H100 (issue 41, about 10 minutes): MODEL=llama-2-7b QUICK= PROFILE_S=330 \
#   bash bench/gpu_checks.sh profile validate; then here, bench/profile_vs_cost.py against the reference
#   operator profiles' fit.
set -u
OUT=${OUT:-/tmp/gpu-out}
W=$OUT/gpu
mkdir -p "$W"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
# MODEL: mistral-7b unless set (llama-2-7b to compare with the reference operator profiles); POLICIES
# (validate): vllm,sarathi unless set; QUICK= PROFILE_S=400 for the full grid instead of the quick one;
# PROFILE: the profile folder validate reads (a kept one from an earlier call on the same machine);
# FLOOR_MODEL, COMPILE (norms,layers unless set; empty for none), FLOOR_S for the floor stage
MODEL=${MODEL:-mistral-7b}
SIMCTL="python3 -m simctl.cli"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi h200 && echo h200 || echo h100)

stage() {  # stage NAME SECONDS COMMAND...: run it, log it, print its status and last lines, tar the results
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" bash -c "$*" >"$W/$name.log" 2>&1
    local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s"
    tail -n "${TAIL:-6}" "$W/$name.log"
    tar czf "$OUT/gpu.tgz" -C "$OUT" gpu
}

for s in "$@"; do
    case $s in
    env) stage env 60 "nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv; \
        python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__, \
        torch.cuda.get_device_name(0))'" ;;
    tests) stage tests 120 "python3 -m pytest -q -p no:cacheprovider -k 'cuda and not shipped_cpu_fit' \
        tests/test_attention.py tests/test_validate_device.py tests/test_graphs.py \
        tests/test_profiler.py -rs" ;;
    floor) stage floor "${FLOOR_S:-200}" "python3 bench/decode_floor.py --model ${FLOOR_MODEL:-$MODEL} \
        --dtype bfloat16 --rows 32 --context 2047 --compile ${COMPILE-norms,layers}" ;;
    kernels) stage kernels 90 "python3 bench/attention_kernels.py --model $MODEL --device cuda \
        --dtype bfloat16 --rows 32 --context 1024 --reps 3" ;;
    protocols) stage protocols 90 "python3 bench/profile_protocols.py --model $MODEL --device cuda \
        --dtype bfloat16 --rounds 1" ;;
    profile) stage profile "${PROFILE_S:-200}" "$SIMCTL profile --model $MODEL --device cuda \
        --dtype bfloat16 ${QUICK---quick} --out $W/profile && $SIMCTL fit $W/profile --roofline-gpu $GPU" ;;
    validate) stage validate 200 "$SIMCTL validate --device cuda \
        --cost ${PROFILE:-$W/profile}/cost_model.json --model $MODEL --policy ${POLICIES:-vllm,sarathi} \
        --loads 0.5,0.7 --scale 0.2 --num-requests 150 --out $W/validate" ;;
    *) echo "unknown stage $s" >&2; exit 2 ;;
    esac
done
