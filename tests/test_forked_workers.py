"""Local workers are forked from one warm template (skyward.worker.template): each sees what a
worker started as ``python -m skyward.worker`` sees, the template reaps them, ends with its last
worker, and dies with a client killed outright, leaving nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import skyward as sky
from tests.conftest import interactive_signals
from tests.faults.test_matrix import tagged, wait_for

CLIENT = Path(__file__).parent / "faults" / "scale_client.py"
ROOT = Path(__file__).parents[1]


def stat(pid: int) -> tuple[str, int, int]:
    """(state, parent pid, session id) of ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[1]), int(fields[4])


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if stat(int(entry))[1] == pid:
                    found.append(int(entry))
            except OSError:
                continue
    return found


@sky.compute
def what_the_worker_sees() -> dict:
    import random

    keeper = os.getppid()
    guard = stat(keeper)[1]
    return {"node": sky.instance_info().node, "pid": os.getpid(), "guard": guard, "template": stat(guard)[1],
            "session": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv, "env": os.environ.get("FORKED_TEST"),
            "path": os.environ.get("PYTHONPATH", ""), "random": random.random()}


def test_workers_are_forked_from_one_template_see_the_clients_env_and_are_reaped_by_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FORKED_TEST", "set after import")
    with sky.ComputePool(nodes=3, console=False) as pool:
        seen = sorted(what_the_worker_sees() @ pool, key=lambda s: s["node"])
        templates = {s["template"] for s in seen}
        assert len(templates) == 1, seen
        template = templates.pop()
        assert stat(template)[1] == os.getpid() and "skyward.worker.template" in cmdline(template)
        for s in seen:  # as a command started with start_new_session, env and cwd would have it
            assert s["session"] == s["guard"] != stat(template)[2]
            assert s["cwd"] == str(tmp_path) and s["env"] == "set after import"
            assert str(tmp_path) in s["path"].split(os.pathsep)
            assert s["argv"] == [str(ROOT / "skyward" / "worker" / "__main__.py")]
        assert len({s["random"] for s in seen}) == 3  # each fork reseeded

        os.kill(seen[2]["pid"], signal.SIGKILL)  # its keepers clear up and the guard exits the same way
        with pytest.raises(sky.WorkerLost, match="node 2.*SIGKILL"):  # (the code the template reported)
            what_the_worker_sees() @ pool
        again = what_the_worker_sees() @ pool  # (a loss restarts every worker)
        # The template reaped its workers, ended with the last one and was reaped before it was
        # said to be gone; the new workers have a new one.
        assert not os.path.exists(f"/proc/{template}")
        assert len({s["template"] for s in again}) == 1 and again[0]["template"] != template
        template = again[0]["template"]
    # The template ended with its last worker, before the pool's close returned.
    assert not os.path.exists(f"/proc/{template}")
    assert [pid for pid in children(os.getpid()) if "skyward.worker" in cmdline(pid)] == []


@pytest.mark.timeout(120)
def test_a_client_killed_outright_takes_its_template_and_every_forked_worker_with_it(tmp_path):
    tag = f"skyfork{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "answered"
    client = subprocess.Popen([sys.executable, str(CLIENT), "8", "60", str(marker)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=tmp_path, preexec_fn=interactive_signals,
                              env=dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT)))
    try:
        assert wait_for(lambda: marker.exists() or client.poll() is not None, 90, interval=0.1), "never opened"
        assert marker.exists(), client.communicate()[0][-3000:]
        found = tagged(tag)
        templates = [pid for pid, cmd in found.items() if "skyward.worker.template" in cmd and stat(pid)[1] == client.pid]
        assert len(templates) == 1, found
        assert len(children(templates[0])) == 8  # the 8 guards
        client.send_signal(signal.SIGKILL)
        client.wait()
        killed = time.monotonic()
        # Well within idle_timeout (60 s): the workers see their input end, the template its socket.
        gone = wait_for(lambda: not tagged(tag), 20, interval=0.1)
        took = time.monotonic() - killed
    finally:
        if client.poll() is None:
            client.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # (a process left holding its output)
            client.communicate(timeout=10)
    assert gone, f"left 20 s after the client was killed: {tagged(tag)}"
    print(f"the template and 8 forked workers of a killed client were gone {took:.1f}s after")


FORKING_CLIENT = """
import os, signal, sys, time
import skyward as sky
pool = sky.ComputePool(nodes=2, console=False).__enter__()
print("open", flush=True)
child = os.fork()
if child == 0:  # a process forked from the client (multiprocessing's fork), outliving it
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
signal.pause()
"""


def test_a_process_forked_from_the_client_does_not_keep_the_template_alive_after_the_client_dies(tmp_path):
    tag = f"skyforkc{uuid.uuid4().hex[:10]}"
    client = subprocess.Popen([sys.executable, "-c", FORKING_CLIENT], stdout=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT)))
    child = 0
    try:
        assert client.stdout.readline().strip() == "open"
        child = int(client.stdout.readline())
        template = [pid for pid, cmd in tagged(tag).items() if "skyward.worker.template" in cmd
                    and stat(pid)[1] == client.pid]
        assert len(template) == 1 and len(children(template[0])) == 2
        client.kill()
        client.wait()
        # (Its workers end with idle_timeout: the forked process holds their input open, as it
        # would hold that of workers started as commands.)
        assert wait_for(lambda: template[0] not in tagged(tag), 20, interval=0.1)
        assert stat(child)[0] != "Z"  # (it was alive all along: the template ended without it)
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
    assert wait_for(lambda: not tagged(tag), 20, interval=0.1), tagged(tag)  # (their input ended with it)
