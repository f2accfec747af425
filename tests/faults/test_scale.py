"""Faults in large Local pools: a client killed outright leaves none of its 256 workers; Ctrl-C
while 512 nodes start stops the start and leaves no worker. (One silent node of 256:
tests/test_scale.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import interactive_signals
from tests.faults.test_matrix import tagged, wait_for

CLIENT = Path(__file__).with_name("scale_client.py")
ROOT = Path(__file__).parents[2]
#: The killed client's idle_timeout: the bound docs/pool.md gives for its workers to end
#: ("on Local the worker notices even sooner, when its input closes"); long, so that the
#: test shows the closed input, not the silence, ending them.
KILLED_IDLE_TIMEOUT = 30.0
#: Ctrl-C during a start: the program ends, and every worker with it, within this (seconds).
#: Measured 11-20 s with the machine's 1-minute load at 80-140 (one stop after another took
#: 94 s); a few seconds on a quiet machine.
INTERRUPT_CLEANS_WITHIN = 30.0


def tagged_workers(tag: str) -> dict[int, str]:
    return {pid: cmd for pid, cmd in tagged(tag).items() if "skyward.worker" in cmd}


def start_client(nodes: int, idle_timeout: float, tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    tag = f"skyscale{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "answered"
    client = subprocess.Popen([sys.executable, str(CLIENT), str(nodes), str(idle_timeout), str(marker)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                              env=dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT)),
                              preexec_fn=interactive_signals)
    return client, tag, marker


@pytest.mark.timeout(300)
def test_a_client_killed_outright_leaves_none_of_its_256_workers(tmp_path):
    client, tag, marker = start_client(256, KILLED_IDLE_TIMEOUT, tmp_path)
    try:
        assert wait_for(lambda: marker.exists() or client.poll() is not None, 240, interval=0.2), "never opened"
        assert marker.exists(), client.communicate()[0][-3000:]
        assert marker.read_text() == "256"
        assert len(tagged_workers(tag)) >= 256
        client.send_signal(signal.SIGKILL)
        client.wait()
        killed = time.monotonic()
        gone = wait_for(lambda: not tagged(tag), KILLED_IDLE_TIMEOUT, interval=0.2)
        took = time.monotonic() - killed
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
    assert gone, f"{len(tagged(tag))} processes of the pool left {KILLED_IDLE_TIMEOUT:g}s after the client was killed"
    print(f"the 256 workers of a killed client were all gone {took:.1f}s after")


@pytest.mark.timeout(300)
def test_ctrl_c_while_512_nodes_start_stops_the_start_and_leaves_no_worker(tmp_path):
    client, tag, marker = start_client(512, KILLED_IDLE_TIMEOUT, tmp_path)
    try:
        assert wait_for(lambda: len(tagged_workers(tag)) >= 64 or client.poll() is not None, 240, interval=0.2)
        assert client.poll() is None, client.communicate()[0][-3000:]
        client.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, _ = client.communicate(timeout=60)
        ended_after = time.monotonic() - interrupted
        gone = wait_for(lambda: not tagged(tag), INTERRUPT_CLEANS_WITHIN, interval=0.2)
        took = time.monotonic() - interrupted
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert "open" not in out.split() and "interrupted: pool" in out, out[-3000:]
    assert ended_after < INTERRUPT_CLEANS_WITHIN and gone, (
        f"the program ended {ended_after:.1f}s after Ctrl-C; left {len(tagged(tag))} processes\n{out[-3000:]}")
    print(f"Ctrl-C during a 512-node start: the program ended after {ended_after:.1f}s, nothing left after {took:.1f}s")
