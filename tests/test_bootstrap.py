"""bootstrap.render: Image -> an idempotent bash script, checked as text and by running it.

Three kinds of test: pure checks on the rendered text; runs of the real script against stub
``uv``/``apt-get``/``sudo``/``id`` commands on PATH (fast, offline, and able to play a
non-root user); and runs that really build an environment with uv, from a local wheelhouse
that is downloaded once and kept in pytest's cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from skyward.bootstrap import (
    STEP_APT,
    STEP_DONE,
    STEP_PIP,
    STEP_SETUP,
    STEP_SKYWARD,
    STEP_UV,
    STEP_VENV,
    STEPS,
    WARM_PREFIX,
    Script,
    env_file_text,
    parse_step,
    render,
    worker_command,
)
from skyward.errors import ConfigError
from skyward.image import Image

REPO = Path(__file__).resolve().parent.parent
SECRET = "hf_s3cr3t_do_not_print"
NASTY = "it's \"quoted\" $(touch PWNED) `touch PWNED` $HOME \\ ; && \n second line"


def steps(stdout: str) -> list[str]:
    return [s for s in map(parse_step, stdout.splitlines()) if s is not None]


# -- pure rendering --------------------------------------------------------------------------------


def test_same_image_renders_the_same_script():
    a = render(Image(pip=["numpy"], env={"A": "1"}), root="/srv/sky", skyward_wheel="/srv/w.whl")
    b = render(Image(pip=["numpy"], env={"A": "1"}), root="/srv/sky", skyward_wheel="/srv/w.whl")
    assert a == b
    assert a.text == b.text


def test_script_is_keyed_by_the_image_content_hash():
    image = Image(pip=["numpy"])
    script = render(image, root="/srv/sky/", skyward_wheel="/srv/w.whl")
    assert script.hash == image.content_hash()
    assert script.env_dir == f"/srv/sky/envs/{image.content_hash()}"
    assert script.python == f"{script.env_dir}/bin/python"


def test_different_images_get_different_environments():
    a = render(Image(pip=["numpy"]), root="/r", skyward_wheel="/w.whl")
    b = render(Image(pip=["pandas"]), root="/r", skyward_wheel="/w.whl")
    assert a.hash != b.hash and a.env_dir != b.env_dir and a.text != b.text


@pytest.mark.parametrize("root", ["relative/root", "", "./x", "$HOME/x"])
def test_root_must_be_absolute_or_home_relative(root):
    with pytest.raises(ConfigError) as err:
        render(Image(), root=root, skyward_wheel="/w.whl")
    assert err.value.parameter == "root"


def test_script_repr_leaves_out_the_text_and_its_secrets():
    script = render(Image(env={"HF_TOKEN": SECRET}), root="/r", skyward_wheel="/w.whl")
    assert SECRET in script.text
    assert SECRET not in repr(script)


def test_secret_values_appear_only_in_the_line_that_writes_the_env_file():
    script = render(Image(env={"HF_TOKEN": SECRET}, setup=["true"]), root="/r", skyward_wheel="/w.whl")
    lines = [line for line in script.text.splitlines() if SECRET in line]
    assert len(lines) == 1
    assert lines[0].rstrip().endswith('> "$ENV_FILE" ); }')
    assert "echo" not in lines[0]


IMAGES = [
    Image(),
    Image(python="3.12", pip=["numpy>=1.26", "torch==2.3.0; sys_platform == 'linux'"],
          pip_indexes=["https://download.pytorch.org/whl/cpu", "file:///srv/simple"],
          apt=["ffmpeg", "libgl1=1.7.0-1"], env={"A": NASTY, "HF_TOKEN": SECRET},
          setup=["echo 'one' && ls | wc -l", "for i in 1 2; do echo $i; done", "cat <<EOF\nx\nEOF"]),
    Image(setup=["if true; then", "fi"]),  # commands that are not valid on their own
    Image(env={"UV_PYTHON_DOWNLOADS": "automatic"}),
]


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("kwargs", [{}, {"find_links": ["/w h", "https://x/links"], "no_index": True}])
@pytest.mark.parametrize("root", ["/srv/sky", "~/.skyward", "/path with 'quotes'"])
def test_every_rendered_script_passes_bash_syntax_check(tmp_path, image, kwargs, root):
    script = render(image, root=root, skyward_wheel="/tmp/skyward 0.1.whl", **kwargs)
    path = tmp_path / "bootstrap.sh"
    path.write_text(script.text)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_script_announces_only_known_steps():
    text = render(IMAGES[1], root="/r", skyward_wheel="/w.whl").text
    announced = set(re.findall(r"^\s*step (\w+)$", text, flags=re.MULTILINE))
    assert announced == set(STEPS)


@pytest.mark.parametrize("name", STEPS)
def test_parse_step_reads_every_step_marker(name):
    assert parse_step(f"::step:: {name}\n") == name


@pytest.mark.parametrize("line", ["", "::step::", "::step:: frobnicate", "step:: uv", f"{WARM_PREFIX} env", "uv"])
def test_parse_step_ignores_other_lines(line):
    assert parse_step(line) is None


def test_worker_command_sources_the_env_and_execs_the_worker():
    script = render(Image(), root="/srv/my sky", skyward_wheel="/w.whl")
    cmd = worker_command(script, root="/srv/my sky", args=["--node", "3", "a b"])
    assert cmd == (f"cd '/srv/my sky' && . '{script.env_dir}/.skyward-env' && "
                   f"exec '{script.python}' -m skyward.worker --node 3 'a b'")


def test_home_relative_paths_are_expanded_on_the_host():
    script = render(Image(), root="~/.skyward", skyward_wheel="~/w.whl")
    assert 'ROOT="$HOME"/.skyward' in script.text
    assert worker_command(script, root="~/.skyward").startswith('cd "$HOME"/.skyward && . "$HOME"/.skyward/envs/')


# -- running the script against stub tools ---------------------------------------------------------

UV_STUB = r"""
printf 'uv %s\n' "$*" >> "$STUB_LOG"
case "$1" in
  --version) echo "uv 0.0.0 (stub)" ;;
  venv)
    printf 'venv downloads=%s\n' "${UV_PYTHON_DOWNLOADS:-unset}" >> "$STUB_LOG"
    sleep "${STUB_VENV_SLEEP:-0}"
    dir="${!#}"; mkdir -p "$dir/bin"; ln -s "$STUB_PYTHON" "$dir/bin/python" ;;
  pip) printf 'pip sees A=%s index=%s\n' "${A:-unset}" "${UV_EXTRA_INDEX_URL:-unset}" >> "$STUB_LOG" ;;
esac
"""


def _path_without_uv() -> str:
    """The PATH of this process minus directories holding a real uv (the script must find ours)."""
    dirs = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not os.path.exists(os.path.join(d, "uv")))


class Host:
    """A scratch 'remote host': a root directory, stub commands first on PATH, a call log."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.root = str(tmp_path / "root")
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True)
        self.log = tmp_path / "calls.log"
        self.log.touch()
        self.wheel = tmp_path / "skyward-0.1.0-py3-none-any.whl"
        self.wheel.write_bytes(b"wheel v1")

    def stub(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)

    def render(self, image: Image, **kwargs) -> Script:
        return render(image, root=self.root, skyward_wheel=str(self.wheel), **kwargs)

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env.update(PATH=f"{self.bin}{os.pathsep}{_path_without_uv()}", STUB_LOG=str(self.log),
                   STUB_PYTHON=sys.executable, HOME=str(self.tmp), **extra)
        return env

    def run(self, script: Script, **extra: str) -> subprocess.CompletedProcess[str]:
        # Piped to `bash -s`, the way a transport should send it (never on a command line).
        return subprocess.run(["bash", "-s"], input=script.text, capture_output=True, text=True,
                              env=self.environ(**extra), cwd=self.tmp, timeout=120)

    def calls(self, prefix: str = "") -> list[str]:
        return [line for line in self.log.read_text().splitlines() if line.startswith(prefix)]


@pytest.fixture
def host(tmp_path) -> Host:
    h = Host(tmp_path)
    h.stub("uv", UV_STUB)
    return h


def test_cold_run_goes_through_every_step_and_marks_the_environment_ready(host):
    script = host.render(Image(pip=["numpy"], setup=["true"]))
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert steps(proc.stdout) == [STEP_UV, STEP_VENV, STEP_PIP, STEP_SETUP, STEP_SKYWARD, STEP_DONE]
    assert Path(script.env_dir, ".ready").exists()
    assert WARM_PREFIX not in proc.stdout


def test_steps_without_work_are_left_out(host):
    proc = host.run(host.render(Image()))
    assert proc.returncode == 0, proc.stderr
    assert steps(proc.stdout) == [STEP_UV, STEP_VENV, STEP_SKYWARD, STEP_DONE]


def test_second_run_is_a_warm_start_that_installs_nothing(host):
    script = host.render(Image(pip=["numpy"], setup=["echo ran >> \"$HOME/setup-runs\""]))
    assert host.run(script).returncode == 0
    calls_after_first = len(host.calls())
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert f"{WARM_PREFIX} environment {script.hash} is ready" in proc.stdout
    assert steps(proc.stdout) == [STEP_SKYWARD, STEP_DONE]
    assert len(host.calls()) == calls_after_first  # uv was not even looked up
    assert (host.tmp / "setup-runs").read_text() == "ran\n"


def test_uv_builds_the_venv_for_the_images_python_without_downloading_one(host):
    script = host.render(Image(python="3.12"))
    assert host.run(script).returncode == 0
    assert host.calls("uv venv") == [f"uv venv --python 3.12 {script.env_dir}"]
    assert host.calls("venv downloads=") == ["venv downloads=never"]


def test_image_env_may_allow_python_downloads(host):
    assert host.run(host.render(Image(env={"UV_PYTHON_DOWNLOADS": "automatic"}))).returncode == 0
    assert host.calls("venv downloads=") == ["venv downloads=automatic"]


def test_pip_packages_are_installed_with_extra_indexes_and_local_links(host):
    image = Image(pip=["numpy>=1.26", "pandas"], pip_indexes=["https://example.org/simple"], env={"A": "x"})
    script = host.render(image, find_links=["/srv/wheels"], no_index=True)
    assert host.run(script).returncode == 0
    assert host.calls("uv pip install") == [
        f"uv pip install --python {script.python} --find-links /srv/wheels --no-index numpy>=1.26 pandas",
        f"uv pip install --python {script.python} --reinstall-package skyward "
        f"--find-links /srv/wheels --no-index {host.wheel}",
    ]
    # the image env is exported, the indexes are in uv's environment (never on its command line)
    assert host.calls("pip sees") == ["pip sees A=x index=https://example.org/simple"] * 2


def test_setup_commands_run_in_order_with_the_env_and_the_venv_on_path(host):
    image = Image(env={"GREETING": "hello"}, setup=[
        'echo "1 $GREETING" >> "$HOME/out"',
        'echo "2 $VIRTUAL_ENV $(command -v python)" >> "$HOME/out"',
    ])
    script = host.render(image)
    assert host.run(script).returncode == 0
    assert (host.tmp / "out").read_text().splitlines() == [
        "1 hello", f"2 {script.env_dir} {script.env_dir}/bin/python"]


def test_a_failing_setup_command_stops_the_script_at_the_setup_step(host):
    script = host.render(Image(setup=["true", "exit 7"]))
    proc = host.run(script)
    assert proc.returncode != 0
    assert steps(proc.stdout)[-1] == STEP_SETUP
    assert "setup command 2 of 2 failed" in proc.stderr
    assert not Path(script.env_dir, ".ready").exists()


def test_a_failed_build_is_redone_from_scratch_on_the_next_run(host):
    flag = host.tmp / "fail-once"
    flag.touch()
    quoted = shlex.quote(str(flag))
    script = host.render(Image(setup=[f"if [ -e {quoted} ]; then rm {quoted}; exit 1; fi"]))
    assert host.run(script).returncode != 0
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert STEP_VENV in steps(proc.stdout)
    assert len(host.calls("uv venv")) == 2


def test_a_setup_command_reading_stdin_does_not_swallow_the_script(host):
    script = host.render(Image(setup=['cat > "$HOME/stdin-seen"']))
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert steps(proc.stdout)[-1] == STEP_DONE
    assert (host.tmp / "stdin-seen").read_text() == ""


def test_env_values_are_written_quoted_private_and_never_printed(host):
    script = host.render(Image(env={"HF_TOKEN": SECRET, "A": NASTY}))
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert not (host.tmp / "PWNED").exists()
    env_file = Path(script.env_dir, ".skyward-env")
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    read_back = subprocess.run(["bash", "-c", '. "$1" && printf %s "$A"', "_", str(env_file)],
                               capture_output=True, text=True, cwd=host.tmp, check=True)
    assert read_back.stdout == NASTY
    assert not (host.tmp / "PWNED").exists()


def test_home_relative_root_lands_in_the_hosts_home(host):
    script = render(Image(), root="~/sky", skyward_wheel=str(host.wheel))
    assert host.run(script).returncode == 0
    assert (host.tmp / "sky" / "envs" / script.hash / ".ready").exists()


def test_the_skyward_wheel_is_reinstalled_only_when_its_bytes_change(host):
    script = host.render(Image())
    assert host.run(script).returncode == 0
    assert host.run(script).returncode == 0
    assert len(host.calls("uv pip install")) == 1
    host.wheel.write_bytes(b"wheel v2")
    proc = host.run(script)
    assert proc.returncode == 0, proc.stderr
    assert len(host.calls("uv pip install")) == 2
    markers = sorted(p.name for p in Path(script.env_dir).glob(".skyward-wheel-*"))
    assert markers == [".skyward-wheel-" + hashlib.sha256(b"wheel v2").hexdigest()[:16]]


def test_a_missing_wheel_fails_the_skyward_step(host):
    host.wheel.unlink()
    proc = host.run(host.render(Image()))
    assert proc.returncode != 0
    assert steps(proc.stdout)[-1] == STEP_SKYWARD
    assert "skyward wheel is not at" in proc.stderr


def test_concurrent_runs_on_one_host_build_the_environment_once(host):
    script = host.render(Image())
    path = host.tmp / "bootstrap.sh"
    path.write_text(script.text)
    procs = [subprocess.Popen(["bash", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=host.environ(STUB_VENV_SLEEP="0.5")) for _ in range(3)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert len(host.calls("uv venv")) == 1
    assert sum(WARM_PREFIX in out for out, _ in outputs) == 2


# apt, as root and as a user with or without passwordless sudo

def _as_user(host: Host, uid: int, *, sudo: bool | None, installed: bool = False) -> None:
    host.stub("id", f'[ "$1" = -u ] && echo {uid} || exec /usr/bin/id "$@"\n')
    host.stub("dpkg-query", 'echo -n "install ok installed"\n' if installed else "exit 1\n")
    host.stub("apt-get", 'printf "apt-get %s frontend=%s\\n" "$*" "$DEBIAN_FRONTEND" >> "$STUB_LOG"\n')
    if sudo is True:
        host.stub("sudo", '[ "$1" = -n ] && shift; [ "$1" = true ] && exit 0\n'
                          'printf "sudo %s\\n" "$*" >> "$STUB_LOG"; exec "$@"\n')
    elif sudo is False:
        host.stub("sudo", 'echo "sudo: a password is required" >&2; exit 1\n')


def test_apt_packages_are_installed_directly_as_root(host):
    _as_user(host, 0, sudo=None)
    proc = host.run(host.render(Image(apt=["ffmpeg", "libgl1"])))
    assert proc.returncode == 0, proc.stderr
    assert steps(proc.stdout)[:2] == [STEP_UV, STEP_APT]
    assert host.calls("apt-get") == [
        "apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends ffmpeg libgl1 "
        "frontend=noninteractive"]
    assert host.calls("sudo") == []


def test_apt_packages_are_installed_with_passwordless_sudo_when_not_root(host):
    _as_user(host, 1000, sudo=True)
    proc = host.run(host.render(Image(apt=["ffmpeg"])))
    assert proc.returncode == 0, proc.stderr
    assert host.calls("sudo") == [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "
        "--no-install-recommends ffmpeg"]


def test_apt_without_root_or_sudo_fails_naming_the_packages(host):
    _as_user(host, 1000, sudo=False)
    script = host.render(Image(apt=["ffmpeg", "libgl1"]))
    proc = host.run(script)
    assert proc.returncode != 0
    assert steps(proc.stdout)[-1] == STEP_APT
    assert "ffmpeg libgl1" in proc.stderr and "sudo" in proc.stderr
    assert host.calls("apt-get") == []
    assert not Path(script.env_dir, ".ready").exists()


def test_apt_packages_already_installed_need_no_root(host):
    _as_user(host, 1000, sudo=False, installed=True)
    proc = host.run(host.render(Image(apt=["bash"])))
    assert proc.returncode == 0, proc.stderr
    assert "already installed" in proc.stdout
    assert host.calls("apt-get") == []


def test_apt_lists_are_updated_when_the_first_install_fails(host):
    _as_user(host, 0, sudo=None)
    host.stub("apt-get", 'printf "apt-get %s\\n" "$*" >> "$STUB_LOG"\n'
                         '[ "$3" = install ] && [ ! -e "$HOME/updated" ] && exit 100\n'
                         '[ "$3" = update ] && touch "$HOME/updated"; exit 0\n')
    proc = host.run(host.render(Image(apt=["ffmpeg"])))
    assert proc.returncode == 0, proc.stderr
    assert [c.split()[3] for c in host.calls("apt-get")] == ["install", "update", "install"]


def test_apt_held_lock_fails_saying_another_package_manager_holds_it(host):
    _as_user(host, 0, sudo=None)
    # What apt-get prints when DPkg::Lock::Timeout runs out (apt 2.x wording).
    host.stub("apt-get", 'printf "apt-get %s\\n" "$*" >> "$STUB_LOG"\n'
                         'echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 77 '
                         '(unattended-upgr)" >&2; exit 100\n')
    proc = host.run(host.render(Image(apt=["ffmpeg"])))
    assert proc.returncode != 0
    assert steps(proc.stdout)[-1] == STEP_APT
    assert "dpkg lock, held by another package manager" in proc.stderr
    assert [c.split()[3] for c in host.calls("apt-get")] == ["install"]  # no update behind a held lock


# -- real builds with uv ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def wheelhouse(request, tmp_path_factory) -> Path:
    """uv and skyward's dependencies as wheels: downloaded once, then reused offline."""
    requirements = ["uv", *tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    cache = getattr(request.config, "cache", None)
    directory = Path(cache.mkdir("skyward-wheelhouse")) if cache else tmp_path_factory.mktemp("wheelhouse")
    stamp = directory / "requirements.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(requirements):
        return directory
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(directory), *requirements],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("downloading the test wheelhouse took too long")
    if proc.returncode != 0:
        pytest.skip("cannot download the test wheelhouse: " + proc.stderr[-500:])
    stamp.write_text("\n".join(requirements))
    return directory


def _build_skyward_wheel(tmp: Path, extra_module: str = "") -> Path:
    """A wheel of this checkout, built from a copy so the build leaves nothing in the repo."""
    src = tmp / "src"
    shutil.copytree(REPO / "skyward", src / "skyward", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    readme = REPO / "README.md"
    (src / "README.md").write_text(readme.read_text() if readme.exists() else "skyward\n")
    if extra_module:
        (src / "skyward" / "_wheel_probe.py").write_text(extra_module)
    # With setuptools already here, build without fetching it again (offline and faster).
    local = ["--no-build-isolation"] if _has("setuptools") else []
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *local, "-w", str(tmp / "dist"), str(src)]
    try:  # (generous: under SKYWARD_TEST_NO_SKIP a skip fails, and the machine may be busy)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("building the skyward wheel took more than 180 s")
    if proc.returncode != 0:
        pytest.skip("cannot build the skyward wheel here: " + proc.stderr[-500:])
    (wheel,) = (tmp / "dist").glob("skyward-*.whl")
    return wheel


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _tiny_wheel(directory: Path) -> Path:
    """A one-module wheel, written by hand: a pip package that needs no index at all."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "tinyprobe.py": b"VALUE = 42\n",
        "tinyprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinyprobe\nVersion: 1.0\n",
        "tinyprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                         b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinyprobe-1.0.dist-info/RECORD,,")
    files["tinyprobe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / "tinyprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def started_programs(script: Script, host: Host, trace: Path) -> list[str]:
    """The programs ``script`` starts (execs, by name), run on ``host`` under strace."""
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), "bash", "-s"],
                          input=script.text, capture_output=True, text=True, env=host.environ(), cwd=host.tmp,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    execs = [line.split('execve("', 1)[1].split('"', 1)[0] for line in trace.read_text().splitlines()
             if 'execve("' in line and ") = 0" in line]
    return [os.path.basename(path) for path in execs[1:]]  # (the first: bash itself)


def test_real_build_creates_the_environment_and_then_starts_warm(tmp_path, wheelhouse):
    wheel = _build_skyward_wheel(tmp_path / "wheel1")
    links = [str(wheelhouse), str(_tiny_wheel(tmp_path / "links").parent)]
    host = Host(tmp_path / "host")
    image = Image(pip=["tinyprobe"], env={"HF_TOKEN": SECRET, "GREETING": NASTY},
                  setup=['printf %s "$GREETING" > "$VIRTUAL_ENV/greeting.txt"'])
    script = render(image, root=host.root, skyward_wheel=str(wheel), find_links=links, no_index=True)
    uv_cache = str(tmp_path / "uv-cache")

    started = time.monotonic()
    cold = host.run(script, UV_CACHE_DIR=uv_cache)
    cold_s = time.monotonic() - started
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert steps(cold.stdout) == [STEP_UV, STEP_VENV, STEP_PIP, STEP_SETUP, STEP_SKYWARD, STEP_DONE]
    assert Path(host.root, "uv-pkg", "bin", "uv").exists()  # uv came from `pip install --target`
    assert Path(script.env_dir, ".ready").exists()
    assert Path(script.env_dir, "greeting.txt").read_text() == NASTY
    assert SECRET not in cold.stdout + cold.stderr
    assert not (host.tmp / "PWNED").exists()
    code = "import tinyprobe, skyward.bootstrap as b; print(tinyprobe.VALUE, b.__file__)"
    probe = subprocess.run([script.python, "-c", code], capture_output=True, text=True, check=True, cwd=host.tmp)
    assert probe.stdout.startswith("42 " + script.env_dir)  # skyward imported from the env, not the repo

    started = time.monotonic()
    warm = host.run(script, UV_CACHE_DIR=uv_cache)
    warm_s = time.monotonic() - started
    assert warm.returncode == 0, warm.stderr
    assert WARM_PREFIX in warm.stdout
    assert steps(warm.stdout) == [STEP_SKYWARD, STEP_DONE]
    assert warm_s < cold_s / 4, (warm_s, cold_s)
    # A warm run, with the wheel's hash from the client (as a pool gives it), starts no process
    # but flock: every pool start pays this on every host.
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    assert started_programs(render(image, root=host.root, skyward_wheel=str(wheel), find_links=links, no_index=True,
                                   wheel_sha=sha), host, tmp_path / "execs") == ["flock"]

    # The worker command runs in the env with the image's variables exported.
    cmd = worker_command(script, root=host.root).replace(
        " -m skyward.worker", " -c 'import os, tinyprobe; print(os.environ[\"GREETING\"], end=\"\")'")
    shown = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=host.environ())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == NASTY

    # A client with different skyward code gets it installed on the next (warm) start.
    new_wheel = _build_skyward_wheel(tmp_path / "wheel2", extra_module="PROBE = 1\n")
    again = render(image, root=host.root, skyward_wheel=str(new_wheel), find_links=links, no_index=True)
    assert again.hash == script.hash
    updated = host.run(again, UV_CACHE_DIR=uv_cache)
    assert updated.returncode == 0, updated.stderr
    assert WARM_PREFIX in updated.stdout
    subprocess.run([script.python, "-c", "import skyward._wheel_probe"], check=True, cwd=host.tmp)


def test_uv_is_fetched_with_the_standard_library_when_python3_has_no_pip(tmp_path, wheelhouse):
    host = Host(tmp_path)
    # python3 without site-packages: `python3 -m pip` fails as on a stock Ubuntu cloud image.
    host.stub("python3", f'exec {shlex.quote(sys.executable)} -S "$@"\n')
    _as_user(host, 1000, sudo=False)  # ...and stop right after the uv step, at apt
    script = host.render(Image(apt=["skyward-absent-probe"]), find_links=[str(wheelhouse)], no_index=True)
    proc = host.run(script)
    assert steps(proc.stdout) == [STEP_UV, STEP_APT], proc.stderr
    uv = Path(host.root, "uv-pkg", "bin", "uv")
    assert sorted(p.name for p in Path(host.root, "uv-pkg").iterdir()) == ["bin"]  # not pip's layout
    assert subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=True).stdout.startswith("uv ")


def test_a_worker_command_may_consume_the_env_file_it_reads():
    script = render(Image(env={"HF_TOKEN": SECRET}), root="/r", skyward_wheel="/w.whl", env_file="/r/run/x.env")
    cmd = worker_command(script, root="/r", consume_env=True)
    assert cmd.startswith("cd /r && . /r/run/x.env && rm -f -- /r/run/x.env && exec ")
    assert SECRET not in cmd
    assert env_file_text(Image(env={"HF_TOKEN": SECRET, "A": "it's"})) == (
        f"export A='it'\"'\"'s'\nexport HF_TOKEN={SECRET}\n").encode()
