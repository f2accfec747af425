"""The fault matrix for named clusters: every exit path of a program using a cluster ends with
the cluster UP and attachable, or gone, never half there; and ``skyward down`` then leaves
nothing on any host.

Each case runs :mod:`tests.faults.cluster_client` in a process of its own. ``creating``: the
cluster is new and its first start is held in a plugin hook; ``attached``: the cluster exists,
the program attached and holds a task on every node. After the exit path, the test checks what
the program said, then that the cluster is attachable (and its slots free: the departed
client's tasks were cancelled) or gone, then ends it and checks that nothing is left.
``scripts/reliability.py`` puts the outcomes on docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters import manage
from tests.conftest import interactive_signals
from tests.faults.test_matrix import ROOT, apply_exit_path, clean_up_case, tagged, wait_for
from tests.hosts.conftest_fixture import ssh_provider
from tests.leftovers import cluster_home

CLIENT = Path(__file__).with_name("cluster_client.py")
SETTLE = 15.0


@dataclass(frozen=True)
class Case:
    provider: str  # "local" | "ssh"
    phase: str  # "creating" | "attached"
    path: str

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.phase}-{self.path}"


PATHS = {
    "creating": ("SIGINT", "SIGKILL"),
    "attached": ("return", "SIGINT", "SIGTERM", "SIGKILL", "worker-killed", "link-cut"),
}
#: What each case leaves: the cluster "up" (attachable, the same workers), "restarted"
#: (attachable, its workers started anew), or "gone" (no record, nothing running).
OUTCOME = {("creating", "SIGINT"): "gone", ("creating", "SIGKILL"): "gone",
           ("attached", "worker-killed"): "restarted"}
CASES = [Case(provider, phase, path) for provider in ("local", "ssh") for phase, paths in PATHS.items()
         for path in paths if provider == "ssh" or path != "link-cut"]
#: What the program's output must say, by exit path.
EXPECTED = {
    "return": ["held", "detached"],
    "SIGINT": ["interrupted: pool"],
    "worker-killed": ["WorkerLost: node 1"],
    "link-cut": ["WorkerLost: node 1", "no heartbeat"],
}


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SKYWARD_HOME of the test's own: see tests.leftovers.cluster_home."""
    with cluster_home(monkeypatch, "skyf") as path:
        yield path


@sky.compute
def worker_pid() -> int:
    return os.getpid()


def leftovers(tag: str, hosts) -> dict:
    found = {"this machine": tagged(tag)}
    for h in hosts or ():
        found[h.name] = h.process_cmdlines("skyward")
    return {where: procs for where, procs in found.items() if procs}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_named_cluster_ends_up_attachable_or_gone(case: Case, home: str, request, tmp_path) -> None:
    tag = f"skyfault{uuid.uuid4().hex[:10]}"
    marker = f"/tmp/{tag}"
    name = "f" + tag[-8:]
    hosts = request.getfixturevalue("test_hosts")[:2] if case.provider == "ssh" else None
    cfg = {"name": name, "phase": case.phase, "path": case.path, "marker": marker}
    env = dict(os.environ, SKYWARD_FAULT_TAG=tag, PYTHONPATH=str(ROOT))
    before: list[int] = []
    if hosts:
        wheelhouse = request.getfixturevalue("wheelhouse")
        cfg["ssh"] = {"hosts": [h.ip for h in hosts], "user": hosts[0].user, "key": hosts[0].key_path,
                      "known_hosts": hosts[0].known_hosts_all, "wheelhouse": wheelhouse}
    if case.phase == "attached":  # the cluster exists, made by an earlier program (this one)
        os.environ["SKYWARD_FAULT_TAG"] = tag  # (Local workers inherit it: the leak check finds them)
        try:
            shape = {"provider": ssh_provider(hosts, cfg["ssh"]["wheelhouse"])} if hosts else {}
            with sky.ComputePool(name=name, nodes=2, console=False, **shape) as pool:
                before = worker_pid() @ pool
        finally:
            del os.environ["SKYWARD_FAULT_TAG"]
    client = subprocess.Popen([sys.executable, str(CLIENT), json.dumps(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                              preexec_fn=interactive_signals)
    cut = None
    try:
        reached = wait_for(lambda: client.poll() is not None
                           or all(Path(f"{marker}-{case.phase}-{n}").exists() for n in (0, 1)), 90)
        assert reached and (case.path == "return" or client.poll() is None), (
            f"the phase was never reached:\n{client.stdout.read() if client.poll() is not None else ''}")
        cut = apply_exit_path(client, case.path, f"{marker}-{case.phase}-1", hosts)
        out, _ = client.communicate(timeout=60)
    finally:
        clean_up_case(client, cut, tag)
    missing = [text for text in EXPECTED.get(case.path, ()) if text not in out]
    assert not missing, f"not said: {missing}\nthe program's output:\n{out[-3000:]}"

    outcome = OUTCOME.get((case.phase, case.path), "up")
    if outcome == "gone":
        # The client died creating it: the workers end by themselves (their first client is
        # gone); what is left is a record, which `skyward down` removes.
        assert wait_for(lambda: not leftovers(tag, hosts), SETTLE), leftovers(tag, hosts)
        assert [s.status for s in manage.status([name])] in ([], ["INIT"])
    else:
        started = time.monotonic()
        with sky.ComputePool(name=name, console=False) as pool:  # attachable, its slots free
            after = worker_pid() @ pool
        assert time.monotonic() - started < 30
        if outcome == "up":
            assert after == before, "the cluster's workers did not survive the client"
        else:
            assert set(after).isdisjoint(before)
    assert manage.ClusterStore().get(name) is None or manage.down(name) == []
    assert manage.status([name]) == []
    assert wait_for(lambda: not leftovers(tag, hosts), SETTLE), leftovers(tag, hosts)


@pytest.mark.parametrize("provider", ["local", "ssh"])
def test_autostop_firing_while_clients_attach_never_fails_an_attach(provider: str, home: str, request) -> None:
    """Autostop (1.2 s) fires around the moment each of a run of clients attaches: every one
    gets a working cluster (attached, or its workers started again)."""
    shape = {}
    if provider == "ssh":
        hosts = request.getfixturevalue("test_hosts")[:2]
        shape = {"provider": ssh_provider(hosts, request.getfixturevalue("wheelhouse"))}
    name = "a" + uuid.uuid4().hex[:8]
    with sky.ComputePool(name=name, nodes=2, idle_minutes=0.02, console=False, **shape) as pool:
        worker_pid() @ pool
    for delay in (1.0, 1.1, 1.2, 1.3, 1.15):
        time.sleep(delay)
        with sky.ComputePool(name=name, console=False) as pool:
            assert len(worker_pid() @ pool) == 2
    assert manage.down(name) == []
