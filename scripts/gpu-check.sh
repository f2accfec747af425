#!/usr/bin/env bash
# The CUDA paths a CPU machine never runs, on a machine with NVIDIA GPUs, in a few minutes:
#   ddp     sky.plugins.torch() with NCCL on a Local pool, one worker process per GPU
#   slices  two Local nodes sharing the GPUs through CUDA_VISIBLE_DEVICES slices
#   mingpt  the minGPT task file with --gpus on Local (torchrun, one rank per GPU)
#   mnist   SkyTorch's MNIST example on node.device("cuda") against the GPU directly (steps/s)
#   ops     a walk over common operations on node.device("cuda") against the GPU directly
# Prints a table and exits non-zero if any check failed. Without an NVIDIA GPU it says so and
# exits 0. The checks themselves are scripts/gpu_check.py (`--cpu` tries them on a CPU).
#
# Python: an interpreter whose torch already sees CUDA (PYTHON, else as scripts/_python.sh
# picks); otherwise a virtual environment in .venv-gpu with PyPI's torch 2.13.0 (the CUDA
# build), so the CPU torch of the development environment is left alone.
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi finds none): nothing to check"
    exit 0
fi
gpus=$(nvidia-smi -L | grep -c '^GPU ')
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)

. scripts/_python.sh
_skyward_pick_python || exit 1
cuda_ok() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if ! cuda_ok "$PY"; then
    if [ ! -x .venv-gpu/bin/python ]; then
        echo "gpu-check: $PY has no CUDA torch: making .venv-gpu"
        "${PYTHON:-python3}" -m venv .venv-gpu || exit 1
    fi
    PY=$PWD/.venv-gpu/bin/python
    if ! cuda_ok "$PY"; then
        # === : exactly 2.13.0, never a local build such as 2.13.0+cpu from a wheel directory.
        echo "gpu-check: installing torch 2.13.0 (CUDA build, a few GB) into .venv-gpu"
        "$PY" -m pip install -q "torch===2.13.0" || exit 1
    fi
fi
echo "gpu-check: installing skyward and what the checks import into $PY"
"$PY" -m pip install -q -e ".[launch]" numpy || exit 1
if ! cuda_ok "$PY"; then
    echo "gpu-check: torch in $PY cannot use the GPU:" >&2
    "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' >&2
    exit 1
fi

echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), ${gpus}x ${card}, driver ${driver}," \
     "torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
declare -A limit=([ddp]=180 [slices]=180 [mingpt]=300 [mnist]=240 [ops]=180)
rows=()
failed=0
log=$(mktemp -d)
for check in ddp slices mingpt mnist ops; do
    echo "gpu-check: running $check (at most ${limit[$check]}s)"
    timeout "${limit[$check]}" "$PY" scripts/gpu_check.py "$check" >"$log/$check" 2>&1
    rc=$?
    line=$(grep '^RESULT ' "$log/$check" | tail -n1)
    if [ -z "$line" ]; then
        line="RESULT $check FAILED no result (exit $rc$([ $rc = 124 ] && echo ', past the time limit')): $(tail -c 300 "$log/$check" | tr '\n' ' ')"
    fi
    case "$line" in *" FAILED "*) failed=1; tail -n 20 "$log/$check" >&2 ;; esac
    rows+=("$line")
done

printf '\n%-8s %-8s %s\n' check result figures
for line in "${rows[@]}"; do
    read -r _ name result rest <<<"$line"
    printf '%-8s %-8s %s\n' "$name" "$result" "$rest"
done
echo "(${gpus}x ${card}; record these with the date and the card in docs/benchmarks.md)"
exit $failed
