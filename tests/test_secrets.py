"""Secrets stay secret: in reprs, errors, console output, host process lists and host files.

A secret is an ``Image.env`` value named like one (TOKEN, KEY, SECRET, PASS, CREDENTIAL, AUTH),
one wrapped in ``sky.Secret``, or the credentials in a ``pip_indexes`` URL.
"""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import skyward as sky
from skyward.bootstrap import render
from skyward.errors import BootstrapError
from tests.hosts.conftest_fixture import ssh_provider, wheelhouse  # noqa: F401  (wheelhouse is a fixture)
from tests.test_ssh import leftovers


def secret(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex}"


# -- here: reprs and errors --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["DB_PASS", "db_passwd", "API_AUTH", "AUTHORIZATION", "HF_TOKEN",
                                  "AWS_SECRET_ACCESS_KEY", "GOOGLE_CREDENTIALS", "SSH_KEY", "MYSQL_PASSWORD"])
def test_values_named_like_secrets_never_show_in_reprs(name: str) -> None:
    value = secret("v")
    image = sky.Image(env={name: value, "PLAIN": "visible"})
    assert value not in repr(image) and value not in repr(image.env)
    assert "visible" in repr(image) and name in repr(image)
    assert image.env[name] == value and value in image.secrets()


def test_a_value_marked_secret_is_hidden_whatever_its_name() -> None:
    value = secret("postgres://u:pw@db")
    image = sky.Image(env={"DATABASE_URL": sky.Secret(value)})
    assert value not in repr(image) and value not in str(image.env)
    assert image.env["DATABASE_URL"] == value  # the hosts get the plain value
    assert image.secrets() == (value,)
    # the mark survives copies, pickling and merging; it does not change what is built
    for copy in (image.with_env(OTHER="1"), image.with_pip("numpy"), pickle.loads(pickle.dumps(image))):
        assert value not in repr(copy) and copy.env["DATABASE_URL"] == value
    assert image.content_hash() == sky.Image(env={"DATABASE_URL": value}).content_hash()


def test_secret_is_a_masked_string_box() -> None:
    box = sky.Secret("hunter2-hunter2")
    assert repr(box) == str(box) == f"{box!s}" == "Secret('***')"
    assert box.reveal() == "hunter2-hunter2" and box == sky.Secret("hunter2-hunter2")
    assert pickle.loads(pickle.dumps(box)) == box


def test_errors_about_secret_values_never_show_them() -> None:
    value = secret("bad")
    for env in ({"DB_PASS": value + "\0"}, {"X": sky.Secret(value + "\0")}, {"API_AUTH": value + "\0"}):
        with pytest.raises(sky.ConfigError) as info:
            sky.Image(env=env)
        assert value not in str(info.value) and "***" in str(info.value)
    with pytest.raises(sky.ConfigError) as info:
        sky.Image(pip_indexes=[f"ftp://user:{value}@example.org/simple"])
    assert value not in str(info.value)


def test_index_credentials_are_in_the_script_file_only_as_an_environment_value() -> None:
    token = secret("tok")
    script = render(sky.Image(pip=["x"], pip_indexes=[f"https://me:{token}@example.org/simple"]),
                    root="/srv/sky", skyward_wheel="/srv/w.whl")
    assert "--extra-index-url" not in script.text and "UV_EXTRA_INDEX_URL" in script.text
    assert sum(token in line for line in script.text.splitlines()) == 1  # the INDEX_URLS= assignment


# -- on SSH test hosts: console, process lists, files -----------------------------------------------


def _uv_spy(host, root: str, wheelhouse: str, log: Path) -> None:
    """Put uv under ``root`` on ``host`` behind a wrapper that records the host's process list
    (``ps``) while each uv command runs, and whether uv got the index through its environment."""
    real = Path(host.home, root, "uv-pkg")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheelhouse,
                    "--target", str(real), "uv"], check=True, capture_output=True, timeout=300)
    spy = Path(host.home, root, "bin", "uv")
    spy.parent.mkdir(parents=True, exist_ok=True)
    spy.write_text(
        "#!/bin/sh\n"
        f"ps -eo args >> {log}/ps-$$.txt\n"
        f'if [ -n "${{UV_EXTRA_INDEX_URL:-}}" ]; then echo index-in-env >> {log}/env-$$.txt; fi\n'
        f'exec {host.home_mount}/{root}/uv-pkg/bin/uv "$@"\n'
    )
    spy.chmod(0o755)


def _files_holding(directory: str, values: list[str]) -> dict[str, int]:
    """Files under ``directory`` whose bytes contain any of ``values``: path -> mode."""
    found = {}
    needles = [v.encode() for v in values]
    for dirpath, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or info.st_size > 8 << 20:  # not ours: wheels, libraries
                    continue
                data = Path(path).read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                found[path] = stat.S_IMODE(os.stat(path).st_mode)
    return found


@sky.compute
def env_value(name: str) -> str:
    return os.environ[name]


def test_secrets_stay_out_of_console_process_lists_and_host_files(test_hosts, wheelhouse, tmp_path, capfd):
    host = test_hosts[0]
    root = f".skyward-secrets-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "spy"
    log.mkdir()
    log.chmod(0o777)
    _uv_spy(host, root, wheelhouse, log)
    by_name, marked, index_token = secret("pass"), secret("marked"), secret("index")
    image = sky.Image(
        env={"DB_PASS": by_name, "DATABASE_URL": sky.Secret(marked), "RUN": uuid.uuid4().hex},
        pip_indexes=[f"http://me:{index_token}@{host.bridge_ip}:9/simple"],
        setup=['echo "db pass is $DB_PASS and url is $DATABASE_URL"'],
    )
    secrets = [by_name, marked, index_token]
    events: list = []
    provider = ssh_provider([host], wheelhouse, root=f"~/{root}")
    with sky.ComputePool(provider=provider, nodes=1, image=image, on_event=events.append) as pool:
        assert env_value("DB_PASS") >> pool == by_name  # the workers still get the values
        assert env_value("DATABASE_URL") >> pool == marked
        running = host.process_cmdlines()
        during = _files_holding(host.home, secrets)
        pool.restart_workers()  # a new worker gets the values again, and leaves no file either
        assert env_value("DB_PASS") >> pool == by_name
        after_restart = _files_holding(host.home, secrets)
    after = _files_holding(host.home, secrets)
    out, err = capfd.readouterr()

    logged = "\n".join(getattr(e, "line", "") for e in events)
    assert "db pass is *** and url is ***" in logged  # the setup output, cleaned
    for value in secrets:
        assert value not in logged and value not in out and value not in err
        assert not any(value in cmd for cmd in running.values()), running
    listings = list(log.glob("ps-*.txt"))
    assert listings, "uv never ran through the spy"
    for listing in listings:
        text = listing.read_text()
        assert "uv-pkg/bin/uv" in text or f"{root}/bin/uv" in text
        assert not any(value in text for value in secrets), text
    assert list(log.glob("env-*.txt")), "the index did not reach uv through its environment"
    # no copy on the host while the workers run (they hold the values), nor after close
    assert during == {} and after_restart == {} and after == {}, (during, after_restart, after)
    assert not leftovers([host])


def test_a_failing_setup_that_prints_a_secret_shows_it_nowhere(test_hosts, wheelhouse, capfd):
    host = test_hosts[0]
    token = secret("tok")
    image = sky.Image(env={"HF_TOKEN": token, "RUN": uuid.uuid4().hex},
                      setup=['echo "token=$HF_TOKEN" >&2; exit 3'])
    with pytest.raises(BootstrapError) as info:
        with sky.ComputePool(provider=ssh_provider([host], wheelhouse), nodes=1, image=image):
            pass
    out, err = capfd.readouterr()
    assert "token=***" in str(info.value)
    assert token not in str(info.value) and token not in out and token not in err
    assert _files_holding(host.home, [token]) == {}
    assert not leftovers([host])
