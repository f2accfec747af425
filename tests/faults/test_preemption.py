"""The fault matrix's spot preemption cases: a spot interruption notice reaches a running task,
then the program ends by each exit path; the callback ran, the client was told, and nothing of
the pool is left on any host (nor in moto's EC2, the ``aws`` fixture checks).

Each case runs :mod:`tests.faults.preempt_client` in a process of its own on a 2-node AWS spot
pool whose instances are the SSH test hosts; node 1's host has a stand-in IMDS at
169.254.169.254 (tests/hosts/imds.py) that publishes the interruption notice once both tasks
have registered their callbacks. ``scripts/reliability.py`` writes the outcomes to
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)
from tests.conftest import interactive_signals
from tests.faults.test_matrix import (
    ROOT,
    SETTLE,
    aws_options,
    clean_up_case,
    down_removes_what_the_watchdog_would,
    tagged,
    wait_for,
)
from tests.hosts import imds, testhosts

CLIENT = Path(__file__).with_name("preempt_client.py")
PATHS = ("return", "exception", "SIGINT", "SIGKILL")
#: What the program's output must say, by exit path (besides the event it was told).
EXPECTED = {
    "return": ["closed"],
    "exception": ["ValueError: node 1 saved its checkpoint and stops", "(node 1)"],
    "SIGINT": ["interrupted: pool"],
    "SIGKILL": [],
}

pytestmark = pytest.mark.skipif(testhosts.unavailable_reason() is not None,
                                reason=str(testhosts.unavailable_reason()))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", PATHS)
def test_a_spot_notice_during_a_task_then_every_exit_path(path, aws, test_hosts, wheelhouse, request, tmp_path):
    hosts = test_hosts[:2]
    tag = f"skyfault{uuid.uuid4().hex[:10]}"
    marker = f"/tmp/{tag}"
    cfg = {"path": path, "marker": marker, "aws": aws_options(request, hosts, wheelhouse)}
    env = dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT))
    with imds.in_host(hosts[1]) as metadata:
        client = subprocess.Popen([sys.executable, str(CLIENT), json.dumps(cfg)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                                  preexec_fn=interactive_signals)
        try:
            registered = wait_for(lambda: client.poll() is not None
                                  or all(Path(f"{marker}-registered-{n}").exists() for n in (0, 1)), 90)
            assert registered and client.poll() is None, (
                f"the tasks never started:\n{client.stdout.read() if client.poll() is not None else ''}")
            metadata.interrupt("terminate")
            noticed = wait_for(lambda: Path(f"{marker}-checkpoint-1").exists()
                               and Path(f"{marker}-told-1").exists(), 30)
            checkpointed = Path(f"{marker}-checkpoint-1").exists()
            told = Path(f"{marker}-told-1").exists()
            if path.startswith("SIG"):
                client.send_signal(signal.Signals[path])
            out, _ = client.communicate(timeout=60)
            node0_checkpointed = Path(f"{marker}-checkpoint-0").exists()
        finally:
            clean_up_case(client, None, tag)

    def left() -> dict:
        found = {"this machine": tagged(tag)}
        for h in hosts:
            found[h.name] = h.process_cmdlines("skyward")
        return {where: procs for where, procs in found.items() if procs}

    left_behind = {} if wait_for(lambda: not left(), SETTLE) else left()
    missing = [text for text in [*EXPECTED[path], "told: node 1 interruption terminate"] if text not in out]
    assert noticed and checkpointed and told, f"callback ran: {checkpointed}, client told: {told}\n{out[-3000:]}"
    assert not left_behind and not missing, (
        f"left behind: {left_behind}\nnot said: {missing}\nthe program's output:\n{out[-3000:]}")
    assert not node0_checkpointed, "node 0 had no notice, its callback must not have run"
    if path == "SIGKILL":
        down_removes_what_the_watchdog_would(aws)
