"""Turn an :class:`~skyward.image.Image` into the bash script that prepares a machine.

:func:`render` is pure: no I/O, same input -> same text. The script it returns, run with bash
on a Debian/Ubuntu host (as root or not), guarantees:

1. The environment lives at ``{root}/envs/{image.content_hash()}``; the marker ``.ready`` in
   it is written last. When the marker exists nothing is installed: the script prints a line
   starting with ``::warm::`` and only checks the skyward wheel.
2. Each step prints ``::step:: <name>`` on stdout before it starts (see :func:`parse_step`),
   so a failure can be attributed to the last step seen. ``set -euo pipefail``: any failing
   command stops the script with a non-zero exit code.
3. ``uv`` is taken from PATH, ``{root}/bin/uv`` or ``{root}/uv-pkg/bin/uv``; otherwise it is
   installed from PyPI with ``python3 -m pip install --target {root}/uv-pkg uv`` (or, where
   python3 has no pip, by fetching the ``uv`` wheel from PyPI with the standard library).
   No ``curl | sh``.
4. apt packages not yet installed are installed as root, else with ``sudo -n``; if neither
   works the script fails naming the packages on stderr.
5. The venv is made with ``uv venv --python {version}`` and ``UV_PYTHON_DOWNLOADS=never``
   unless the image's env sets ``UV_PYTHON_DOWNLOADS``: the host must already have that
   Python (install it with ``apt`` or allow downloads).
6. The env file (``env_file``, default ``{env}/.skyward-env``) holds ``export`` lines for the
   image's env (mode 0600, in a directory made with umask 077). It is written on every run,
   warm or not, so that it need not outlive the pool (:func:`worker_command` may delete it
   once read); it is sourced before the pip, setup and skyward steps, and by the worker. Values are never printed.
   ``Script.text`` does contain them: copy it to a private file (``script_path``: the script
   deletes that file as soon as it starts), never pass it on a command line or log it.
9. ``pip_indexes`` reach ``uv`` through its environment (``UV_EXTRA_INDEX_URL``), never its
   command line: credentials in an index URL never show in a process list.
7. The client's skyward wheel is installed (with its dependencies) after everything else and
   re-installed whenever the wheel file's sha256 differs from the one installed, so a worker
   always runs the client's exact skyward.
8. Concurrent runs on one host (several local nodes) are serialised with ``flock``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from skyward.errors import ConfigError
from skyward.image import Image

__all__ = [
    "STEPS",
    "STEP_APT",
    "STEP_DONE",
    "STEP_PIP",
    "STEP_PREFIX",
    "STEP_SETUP",
    "STEP_SKYWARD",
    "STEP_UV",
    "STEP_VENV",
    "WARM_PREFIX",
    "Script",
    "env_file_text",
    "parse_step",
    "render",
    "worker_command",
]

STEP_UV = "uv"
STEP_APT = "apt"
STEP_VENV = "venv"
STEP_PIP = "pip"
STEP_SETUP = "setup"
STEP_SKYWARD = "skyward"
STEP_DONE = "done"
STEPS = (STEP_UV, STEP_APT, STEP_VENV, STEP_PIP, STEP_SETUP, STEP_SKYWARD, STEP_DONE)

STEP_PREFIX = "::step:: "
WARM_PREFIX = "::warm::"


@dataclass(frozen=True, slots=True)
class Script:
    """A rendered bootstrap script. ``text`` may contain secrets, so ``repr`` leaves it out."""

    text: str = field(repr=False)
    hash: str
    env_dir: str
    python: str
    env_file: str = ""


def parse_step(line: str) -> str | None:
    """The step name if ``line`` is a step marker printed by the script, else ``None``."""
    line = line.strip()
    if line.startswith(STEP_PREFIX):
        name = line[len(STEP_PREFIX):].strip()
        return name if name in STEPS else None
    return None


def _q(path_or_value: str) -> str:
    """shlex.quote, except that a leading ``~`` still means the remote user's home."""
    if path_or_value == "~":
        return '"$HOME"'
    if path_or_value.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path_or_value[2:])
    return shlex.quote(path_or_value)


def _array(name: str, values: Sequence[str]) -> str:
    return f"{name}=(" + " ".join(shlex.quote(v) for v in values) + ")"


def render(image: Image, *, root: str, skyward_wheel: str, find_links: Sequence[str] = (),
           no_index: bool = False, system_site_packages: bool | Sequence[str] = False,
           env_file: str | None = None, script_path: str | None = None, wheel_sha: str = "") -> Script:
    """The bootstrap script for ``image`` under ``root`` on the remote host.

    ``skyward_wheel`` is the path of the client's skyward wheel on the host (the client copies
    it there first). ``find_links`` (local directories or URLs) and ``no_index`` are passed to
    every package installation, including uv's own, for offline or mirrored installs.

    ``system_site_packages`` True makes the venv see the host Python's own packages
    (``uv venv --system-site-packages``); a list of distribution names does that too and
    also keeps uv from installing those names (as requirements or as dependencies), so the
    host's copies are used. Either way the environment gets its own directory (the hash
    covers this choice).

    ``env_file`` is where the image's env is written (default ``{env}/.skyward-env``);
    ``script_path``, the file the script will be run from, is deleted by the script first
    thing (it holds the env values). ``wheel_sha``: the first 16 hex digits of the wheel's
    sha256 when the client knows them (else the script computes them, one Python start more).

    Raises:
        ConfigError: ``root`` is neither absolute nor ``~``-relative.
    """
    if not (root.startswith("/") or root == "~" or root.startswith("~/")):
        raise ConfigError("root", "an absolute path or one starting with ~/", root)
    digest = image.content_hash()
    host_packages = () if isinstance(system_site_packages, bool) else tuple(system_site_packages)
    venv_args = ["--system-site-packages"] if system_site_packages else []
    if system_site_packages:
        keyed = json.dumps([digest, "system-site-packages", sorted(host_packages)])
        digest = hashlib.sha256(keyed.encode()).hexdigest()[:16]
    base = root.rstrip("/")  # "/" -> "", so that paths below never start with "//"
    root = base or "/"
    env_dir = f"{base}/envs/{digest}"
    local_args = [arg for link in find_links for arg in ("--find-links", link)]
    local_args += ["--no-index"] if no_index else []
    env_lines = _env_lines(image)
    write_env = ("printf '%s\\n' " + " ".join(shlex.quote(line) for line in env_lines)) if env_lines else ":"
    env_file = env_file or f"{env_dir}/.skyward-env"

    parts = [
        "#!/usr/bin/env bash",
        f"# skyward bootstrap for image {digest} (generated; do not edit)",
        "set -euo pipefail",
        "umask 022",
        # One compound command: bash parses all of it before running any, so when the script
        # is piped to `bash -s` no command can read (and eat) the rest of it from stdin.
        "{",
        *([f"rm -f -- {_q(script_path)}"] if script_path else []),
        f"ROOT={_q(root)}",
        f"HASH={shlex.quote(digest)}",
        f"ENV_DIR={_q(env_dir)}",
        'PY="$ENV_DIR/bin/python"',
        f"ENV_FILE={_q(env_file)}",
        # Space-separated, as uv reads UV_EXTRA_INDEX_URL (the URLs were checked to hold none).
        f"INDEX_URLS={shlex.quote(' '.join(image.pip_indexes))}",
        f"WHEEL={_q(skyward_wheel)}",
        f"WHEEL_SHA={shlex.quote(wheel_sha)}",
        f"PYTHON_VERSION={shlex.quote(image.resolved_python)}",
        f"PYTHON_DOWNLOADS={shlex.quote(image.env.get('UV_PYTHON_DOWNLOADS', 'never'))}",
        _array("SOURCE_ARGS", local_args),  # for uv pip install (indexes: INDEX_URLS)
        _array("UV_PIP_ARGS", local_args),  # for installing uv itself with pip
        _array("UV_FETCH_LINKS", list(find_links)),
        _array("VENV_ARGS", venv_args),
        _array("HOST_PKGS", host_packages),
        f"UV_FETCH_NO_INDEX={int(no_index)}",
        f"STEP_PREFIX={shlex.quote(STEP_PREFIX)}",
        f"WARM_PREFIX={shlex.quote(WARM_PREFIX)}",
        _COMMON,
        # printf is a builtin: the values never reach a process list or stdout. Written on
        # every run (the pool deletes it at close) and again after the venv step starts afresh.
        # (Builtins only where the folder exists: each process a warm start spares is CPU a host spares.)
        'write_env() { ( umask 077; [ -d "${ENV_FILE%/*}/" ] || mkdir -p "${ENV_FILE%/*}/"; ' + write_env
        + ' > "$ENV_FILE" ); }',
        "write_env",
        "if [ -f \"$ENV_DIR/.ready\" ]; then",
        '  printf \'%s environment %s is ready; skipping installs\\n\' "$WARM_PREFIX" "$HASH"',
        "else",
        "  find_uv",
    ]
    if image.apt:
        parts += [_array("  APT_PKGS", image.apt), _APT]
    parts.append(_VENV)
    parts.append("  write_env")
    if image.pip:
        parts += [_array("  PIP_PKGS", image.pip), _PIP]
    if image.setup:
        parts += [_array("  SETUP_CMDS", image.setup), _SETUP]
    parts += ["fi", _SKYWARD, _DONE, "} </dev/null"]
    text = "\n".join(parts) + "\n"
    return Script(text=text, hash=digest, env_dir=env_dir, python=f"{env_dir}/bin/python", env_file=env_file)


def _env_lines(image: Image) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in sorted(image.env.items())]


def env_file_text(image: Image) -> bytes:
    """What the script writes to the env file: one ``export`` line per variable of the image."""
    return "".join(line + "\n" for line in _env_lines(image)).encode()


def worker_command(script: Script, *, root: str, args: Sequence[str] = (),
                   pythonpath: Sequence[str] = (), consume_env: bool = False) -> str:
    """The shell command that starts ``python -m skyward.worker`` in the script's environment.

    It runs in ``root`` with the image's env exported; ``args`` are appended, quoted.
    ``consume_env`` deletes the env file once it is read (the worker holds the values in its
    environment; whoever starts another worker writes the file again first).
    ``pythonpath`` directories are put first on ``PYTHONPATH`` (after the image's env is read,
    so an image that sets ``PYTHONPATH`` keeps its entries behind them).
    """
    tail = "".join(" " + shlex.quote(a) for a in args)
    path = ""
    if pythonpath:
        joined = ":".join(_q(p) for p in pythonpath)
        path = f'export PYTHONPATH={joined}"${{PYTHONPATH:+:$PYTHONPATH}}" && '
    env_file = _q(script.env_file or script.env_dir + "/.skyward-env")
    consume = f"rm -f -- {env_file} && " if consume_env else ""
    return (f"cd {_q(root)} && . {env_file} && {consume}{path}"
            f"exec {_q(script.python)} -m skyward.worker{tail}")


# The static parts of the script. Every value they use was assigned, quoted, above them.

_COMMON = r"""step() { printf '%s%s\n' "$STEP_PREFIX" "$1"; }
fail() { printf 'skyward bootstrap: %s\n' "$*" >&2; exit 1; }
# Runs "$@" with the image's env exported. The arguments were expanded by the caller, so an
# image variable that happens to share a name with one of this script's cannot change them.
# The index URLs go in uv's environment, not its command line (they may hold credentials).
in_env() ( . "$ENV_FILE" && if [ -n "$INDEX_URLS" ]; then export UV_EXTRA_INDEX_URL="$INDEX_URLS"; fi && exec "$@" )
HOST_ARGS=()
[ ${#HOST_PKGS[@]} -eq 0 ] || HOST_ARGS=(--overrides "$ENV_DIR/.skyward-host-packages")

[ -d "$ROOT/envs" ] || mkdir -p "$ROOT/envs"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/.bootstrap.lock"
  flock -w 1800 9 || fail "timed out waiting for another bootstrap ($ROOT/.bootstrap.lock)"
fi

fetch_uv() {  # for hosts whose python3 has no pip: the uv wheel, by the standard library
  python3 - "$1" "$UV_FETCH_NO_INDEX" ${UV_FETCH_LINKS[@]+"${UV_FETCH_LINKS[@]}"} <<'PYEOF'
import glob, hashlib, io, json, os, platform, sys, urllib.request, zipfile
dest, no_index, links = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
arch = platform.machine()
def fits(name):
    return name.startswith("uv-") and name.endswith(".whl") and "manylinux" in name and arch in name
data = None
for link in links:
    for path in sorted(glob.glob(os.path.join(link, "uv-*.whl"))):
        if fits(os.path.basename(path)):
            data = open(path, "rb").read()
if data is None:
    if no_index:
        sys.exit("no uv wheel for %s in the find-links directories" % arch)
    meta = json.load(urllib.request.urlopen("https://pypi.org/pypi/uv/json", timeout=60))
    found = [f for f in meta["urls"] if fits(f["filename"])]
    if not found:
        sys.exit("PyPI has no uv wheel for " + arch)
    data = urllib.request.urlopen(found[0]["url"], timeout=600).read()
    if hashlib.sha256(data).hexdigest() != found[0]["digests"]["sha256"]:
        sys.exit("the uv wheel downloaded from PyPI failed its sha256 check")
wheel = zipfile.ZipFile(io.BytesIO(data))
member = [n for n in wheel.namelist() if n.endswith(".data/scripts/uv")][0]
os.makedirs(os.path.dirname(dest), exist_ok=True)
with open(dest + ".tmp", "wb") as out:
    out.write(wheel.read(member))
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
PYEOF
}

UV=""
find_uv() {
  [ -n "$UV" ] && return 0
  step uv
  if command -v uv >/dev/null 2>&1; then UV="$(command -v uv)"
  elif [ -x "$ROOT/bin/uv" ]; then UV="$ROOT/bin/uv"
  elif [ -x "$ROOT/uv-pkg/bin/uv" ]; then UV="$ROOT/uv-pkg/bin/uv"
  else
    command -v python3 >/dev/null 2>&1 || fail "uv is missing and so is python3; put uv at $ROOT/bin/uv"
    rm -rf "$ROOT/uv-pkg.tmp"
    if python3 -m pip --version >/dev/null 2>&1; then
      PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --target "$ROOT/uv-pkg.tmp" ${UV_PIP_ARGS[@]+"${UV_PIP_ARGS[@]}"} uv \
        || fail "could not install uv with: python3 -m pip install --target $ROOT/uv-pkg uv"
      rm -rf "$ROOT/uv-pkg"
      mv "$ROOT/uv-pkg.tmp" "$ROOT/uv-pkg"
    else
      fetch_uv "$ROOT/uv-pkg/bin/uv" || fail "could not fetch uv from PyPI (python3 has no pip)"
    fi
    UV="$ROOT/uv-pkg/bin/uv"
    [ -x "$UV" ] || fail "uv was installed but $UV is missing"
  fi
  printf 'using %s (%s)\n' "$("$UV" --version)" "$UV"
}"""

_APT = r"""  step apt
  MISSING=()
  for pkg in "${APT_PKGS[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "${pkg%%=*}" 2>/dev/null || true)"
    [ "$status" = "install ok installed" ] || MISSING+=("$pkg")
  done
  if [ ${#MISSING[@]} -eq 0 ]; then
    echo "apt packages already installed"
  else
    if [ "$(id -u)" -eq 0 ]; then SUDO=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n)
    else fail "cannot install apt packages (${MISSING[*]}): not root and passwordless sudo is not available"
    fi
    command -v apt-get >/dev/null 2>&1 || fail "cannot install apt packages (${MISSING[*]}): no apt-get on this host"
    APT=(${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
    apt_locked() {  # the last apt-get gave up waiting for a lock that another process holds
      grep -qiE "could not get lock|unable to acquire the dpkg|unable to lock" "$APT_LOG"
    }
    APT_LOG="$(mktemp)"
    # Fresh cloud images often have no package lists yet: update only when install fails.
    if ! "${APT[@]}" install -y -q --no-install-recommends "${MISSING[@]}" 2>&1 | tee "$APT_LOG"; then
      apt_locked && fail "apt-get waited 600s for the dpkg lock, held by another package manager" \
                         "(unattended-upgrades at boot?): wait for it or stop it, then start the pool again"
      "${APT[@]}" update -q 2>&1 | tee "$APT_LOG" \
        || { apt_locked && fail "apt-get update waited 600s for the apt lock, held by another package manager"; \
             fail "apt-get update failed"; }
      "${APT[@]}" install -y -q --no-install-recommends "${MISSING[@]}" 2>&1 | tee "$APT_LOG" \
        || fail "apt-get install failed for: ${MISSING[*]}"
    fi
  fi"""

_VENV = r"""  step venv
  rm -rf "$ENV_DIR"
  # The host's own packages are those of the python3 a login shell finds. uv would pass over
  # it if it is itself a venv (and take, say, /usr/bin/python3 instead): name it, when it is
  # the version asked for, and let the new env see that venv's packages too.
  VENV_PY="$PYTHON_VERSION"
  HOST_SITE=""
  if [ ${#VENV_ARGS[@]} -gt 0 ] && HOST_PY=$(command -v python3) \
      && "$HOST_PY" -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(sys.argv[1] not in (v, v + "." + str(sys.version_info[2])))' "$PYTHON_VERSION"; then
    VENV_PY="$HOST_PY"
    HOST_SITE=$("$HOST_PY" -c 'import site, sys; sys.prefix != sys.base_prefix and print("\n".join(site.getsitepackages()))')
  fi
  UV_PYTHON_DOWNLOADS="$PYTHON_DOWNLOADS" "$UV" venv ${VENV_ARGS[@]+"${VENV_ARGS[@]}"} --python "$VENV_PY" "$ENV_DIR" \
    || fail "no Python $PYTHON_VERSION for uv venv on this host:" \
            "install it, or set UV_PYTHON_DOWNLOADS=automatic in the image env"
  if [ -n "$HOST_SITE" ]; then
    for d in "$ENV_DIR"/lib/python*/site-packages; do printf '%s\n' "$HOST_SITE" > "$d/_skyward_host_python.pth"; done
  fi
  # Packages taken from the host's Python: an override with a marker that is never true
  # drops them from every resolution (works with any uv, old ones included).
  for pkg in ${HOST_PKGS[@]+"${HOST_PKGS[@]}"}; do
    printf '%s ; python_version < "0"\n' "$pkg"
  done > "$ENV_DIR/.skyward-host-packages"
"""

_PIP = r"""  step pip
  in_env "$UV" pip install --python "$PY" ${SOURCE_ARGS[@]+"${SOURCE_ARGS[@]}"} ${HOST_ARGS[@]+"${HOST_ARGS[@]}"} \
    "${PIP_PKGS[@]}"
"""

_SETUP = r"""  step setup
  UV_DIR="$(dirname "$UV")"
  i=0
  for cmd in "${SETUP_CMDS[@]}"; do
    i=$((i + 1))
    printf 'setup command %d of %d\n' "$i" "${#SETUP_CMDS[@]}"
    # Positional parameters survive sourcing the image env (see in_env).
    ( set -- "$ENV_DIR" "$UV_DIR" "$cmd" "$ENV_FILE"; . "$4"
      export VIRTUAL_ENV="$1" PATH="$1/bin:$2:$PATH"; exec bash -c "$3" ) \
      || fail "setup command $i of ${#SETUP_CMDS[@]} failed"
  done
"""

_SKYWARD = r"""step skyward
[ -f "$WHEEL" ] || fail "the skyward wheel is not at $WHEEL"
[ -n "$WHEEL_SHA" ] || WHEEL_SHA="$("$PY" -c 'import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()[:16])' "$WHEEL")"
if [ -f "$ENV_DIR/.skyward-wheel-$WHEEL_SHA" ]; then
  echo "skyward wheel $WHEEL_SHA already installed"
else
  find_uv
  in_env "$UV" pip install --python "$PY" --reinstall-package skyward ${SOURCE_ARGS[@]+"${SOURCE_ARGS[@]}"} \
    ${HOST_ARGS[@]+"${HOST_ARGS[@]}"} "$WHEEL"
  rm -f "$ENV_DIR"/.skyward-wheel-*
  : > "$ENV_DIR/.skyward-wheel-$WHEEL_SHA"
fi"""

_DONE = r""": > "$ENV_DIR/.ready"
step done"""
