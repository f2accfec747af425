# Sourced by the other scripts: sets PY to an interpreter that pip may install into.
#
#   - a virtual environment that is active (or the one python3 already runs in): that one;
#   - a python3 whose installs pip allows (pyenv, conda, a CI image): that one, so packages
#     already installed there (torch, jax) are used as they are;
#   - an "externally managed" python3 (Debian/Ubuntu's own, PEP 668: pip refuses to install
#     into it): a virtual environment in .venv, made once, that also sees the system's
#     packages (--system-site-packages), so nothing installed there is downloaded again.
#
# Set SKYWARD_VENV=1 to always use .venv.

_skyward_pick_python() {
    local base=${PYTHON:-python3}
    if ! command -v "$base" >/dev/null 2>&1; then
        echo "$0: no $base on PATH: install Python 3.11 or newer" >&2
        return 1
    fi
    local state
    state=$("$base" - <<'PYEOF'
import os, sys, sysconfig
if sys.version_info < (3, 11):
    print("old")
elif sys.prefix != sys.base_prefix:
    print("venv")
elif os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")):
    print("managed")
else:
    print("free")
PYEOF
    ) || return 1
    if [ "$state" = old ]; then
        echo "$0: skyward needs Python 3.11 or newer; $base is $("$base" -V 2>&1)" >&2
        return 1
    fi
    if [ "$state" = venv ] || { [ "$state" = free ] && [ "${SKYWARD_VENV:-0}" != 1 ]; }; then
        PY=$(command -v "$base")
        return 0
    fi
    if [ ! -x .venv/bin/python ]; then
        echo "$0: $base is managed by the system (pip may not install into it): making a virtual environment in .venv"
        "$base" -m venv --system-site-packages .venv || {
            echo "$0: could not make .venv; on Debian/Ubuntu: apt-get install python3-venv" >&2
            return 1
        }
    fi
    PY=$PWD/.venv/bin/python
    echo "$0: using $PY (activate it with: . .venv/bin/activate)"
}

# install_torch_cpu PY: a CPU build of torch unless one (any build) is importable already.
# Never a plain `pip install torch`: on Linux that is the CUDA build, several GB.
install_torch_cpu() {
    local py=$1
    "$py" -c "import torch" 2>/dev/null && return 0
    # 2.13.0+cpu: from pip's configured sources (a local wheel directory) when it is there,
    # else from PyTorch's CPU index; a "+cpu" version exists nowhere else, so neither step
    # can fall back to a CUDA build.
    "$py" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
        || "$py" -m pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
}
