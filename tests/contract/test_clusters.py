"""Named clusters, on every transport: a pool that outlives its client, is attached to again
(the same worker processes), refuses a shape it does not have, serves one client at a time,
cancels a departed client's tasks, stops itself when idle, and ends only when asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward as sky
from skyward.clusters import manage
from tests.conftest import pid_alive, wait_gone
from tests.contract.tasks import echo
from tests.hosts.conftest_fixture import ssh_provider
from tests.leftovers import cluster_home

NODES = 2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SKYWARD_HOME of the test's own: see tests.leftovers.cluster_home."""
    with cluster_home(monkeypatch, "skyh") as path:
        yield path


@pytest.fixture(params=("local", "ssh"))
def shape(request: pytest.FixtureRequest, home: str) -> dict:
    """The arguments that create a 2-node cluster on this transport."""
    if request.param == "local":
        return {"nodes": NODES}
    hosts = request.getfixturevalue("test_hosts")[:NODES]
    provider = ssh_provider(hosts, request.getfixturevalue("wheelhouse"))
    return {"nodes": NODES, "provider": provider}


def name() -> str:
    return "c" + uuid.uuid4().hex[:8]


@sky.compute
def worker_pid() -> int:
    return os.getpid()


@sky.compute
def hold_then_mark(release: str, mark: str, limit: float = 20.0) -> str:
    """Hold until ``release`` exists (polling: cancellable), then create ``mark``."""
    deadline = time.monotonic() + limit
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(mark).touch()
    return "finished"


def test_a_named_pool_outlives_its_block_and_is_attached_again(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        first = worker_pid() @ pool
    assert all(pid_alive(p) for p in first), "leaving the block of a named pool ended its workers"
    started = time.monotonic()
    with sky.ComputePool(name=cluster, console=False) as pool:  # by name alone
        again = worker_pid() @ pool
        attach = time.monotonic() - started
    assert again == first, "attaching must reach the same worker processes"
    assert attach < 10, f"attaching took {attach:.1f}s"  # (the benchmark measures it: ~0.3 s)
    [state] = manage.status([cluster])
    assert state.status == "UP" and state.holder is None


def test_pool_down_ends_the_workers_and_forgets_the_cluster(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        pids = worker_pid() @ pool
        pool.down()
    assert wait_gone(pids, 10) == []
    assert manage.status([cluster]) == []
    with pytest.raises(sky.ClusterError, match="no cluster by this name"):
        sky.ComputePool(name=cluster)


def test_a_shape_that_disagrees_is_refused_naming_the_field_and_touches_nothing(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        pids = worker_pid() @ pool
    started = time.monotonic()
    with pytest.raises(sky.ClusterError) as caught:
        sky.ComputePool(name=cluster, **{**shape, "nodes": NODES + 1})
    assert time.monotonic() - started < 5
    error = caught.value
    assert (error.field, error.wanted, error.have) == ("nodes", NODES + 1, NODES)
    assert f"skyward down {cluster}" in str(error)
    assert all(pid_alive(p) for p in pids)
    with sky.ComputePool(name=cluster, console=False) as pool:
        assert worker_pid() @ pool == pids


def test_leaving_cancels_the_clients_tasks_and_frees_the_workers(shape: dict, tmp_path: Path) -> None:
    cluster = name()
    release, mark = str(tmp_path / "release"), str(tmp_path / "mark")
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        futures = [hold_then_mark(release, f"{mark}{i}") > pool for i in range(NODES)]
        time.sleep(0.5)  # (running now)
    started = time.monotonic()
    with sky.ComputePool(name=cluster, console=False) as pool:
        assert echo(7) @ pool == [7] * NODES  # one slot per worker: free again
        freed = time.monotonic() - started
    assert freed < 10
    assert all(f.done() for f in futures)
    Path(release).touch()
    time.sleep(1)
    assert not any(os.path.exists(f"{mark}{i}") for i in range(NODES)), "a departed client's task went on"


CLIENT = textwrap.dedent("""
    import os, sys, time
    import skyward as sky
    from pathlib import Path

    @sky.compute
    def hold(release):
        while not os.path.exists(release):
            time.sleep(0.01)
        return 1

    with sky.ComputePool(name=sys.argv[1], console=False, idle_timeout=3.0) as pool:
        futures = [hold(sys.argv[2]) > pool for _ in range(int(sys.argv[3]))]
        print("holding", flush=True)
        time.sleep(600)
""")


def _client(cluster: str, release: str, tasks: int = NODES) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, cluster, release, str(tasks)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "holding", proc.stderr.read() if proc.stderr else ""
    return proc


def test_a_cluster_still_held_when_its_test_ends_is_ended_and_its_home_removed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the ``home`` fixture does after a test that failed with a client still attached:
    ``skyward down`` alone would be refused (ClusterBusy) and leave the workers running."""
    with cluster_home(monkeypatch, "skyh") as path:
        with sky.ComputePool(name="held", nodes=1, console=False) as pool:
            pids = worker_pid() @ pool
        holder = _client("held", str(tmp_path / "release"), tasks=1)
        with pytest.raises(sky.ClusterBusy):
            manage.down("held")
    assert holder.wait(10) == -signal.SIGKILL
    assert wait_gone(pids, 15) == [], "a worker of the held cluster is still running"
    assert not os.path.exists(path)


def test_a_named_pool_left_open_by_a_failing_test_is_ended_with_its_home(monkeypatch: pytest.MonkeyPatch) -> None:
    with cluster_home(monkeypatch, "skyh") as path:
        pool = sky.ComputePool(name="open", nodes=1, console=False).__enter__()  # never left
        pids = worker_pid() @ pool
    assert wait_gone(pids, 15) == [], "a worker of the open pool is still running"
    assert not os.path.exists(path)
    pool.__exit__(None, None, None)  # (late: its workers are gone already)


def test_a_second_client_is_refused_at_once_naming_the_holder(shape: dict, tmp_path: Path) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape):
        pass
    holder = _client(cluster, str(tmp_path / "release"))
    try:
        started = time.monotonic()
        with pytest.raises(sky.ClusterBusy) as caught, sky.ComputePool(name=cluster, console=False):
            pass
        assert time.monotonic() - started < 2
        assert caught.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(caught.value)
        [state] = manage.status([cluster])
        assert state.holder is not None and str(holder.pid) in state.holder
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_client_leaves_the_cluster_up_with_its_tasks_cancelled(shape: dict, tmp_path: Path) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        pids = worker_pid() @ pool
    client = _client(cluster, str(tmp_path / "release"))
    client.send_signal(signal.SIGKILL)
    client.wait()
    started = time.monotonic()
    with sky.ComputePool(name=cluster, console=False) as pool:  # the lock died with the client
        assert worker_pid() @ pool == pids  # and the slots are free: its tasks were cancelled
        took = time.monotonic() - started
    assert took < 10


def test_autostop_ends_the_workers_and_the_next_pool_starts_them_again(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, idle_minutes=0.05, **shape) as pool:  # 3 s
        pids = worker_pid() @ pool
    assert wait_gone(pids, 15) == [], "autostop did not end the workers"
    [state] = manage.status([cluster])
    assert state.status == "STOPPED"
    with sky.ComputePool(name=cluster, console=False) as pool:
        again = worker_pid() @ pool
    assert set(again).isdisjoint(pids)
    assert manage.status([cluster])[0].status == "UP"


def test_autostop_with_down_removes_the_cluster(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, idle_minutes=0.05, down=True, **shape) as pool:
        pids = worker_pid() @ pool
    assert wait_gone(pids, 15) == []
    assert manage.status([cluster]) == []


def test_down_alone_keeps_the_cluster_while_attached_and_ends_it_when_the_client_leaves(shape: dict) -> None:
    """``down=True`` without ``idle_minutes`` (SkyPilot's ``--down``): no idle wait, a teardown."""
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, down=True, **shape) as pool:
        pids = worker_pid() @ pool
        time.sleep(2)  # attached: nothing ends
        assert worker_pid() @ pool == pids
    assert wait_gone(pids, 30) == [], "the workers outlived their last client"
    deadline = time.monotonic() + 30
    while manage.status([cluster]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert manage.status([cluster]) == []


def test_autostop_fires_while_skyward_status_polls_the_cluster(shape: dict) -> None:
    """Observing must not change what it observes: `skyward status` every 0.5 s (a dashboard,
    SkyPilot's wait loop) is no use of the cluster, and its autostop still fires."""
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, idle_minutes=0.05, **shape) as pool:  # 3 s
        pids = worker_pid() @ pool
    done = threading.Event()
    polls: list[int] = []

    def poll() -> None:
        while not done.is_set():
            shown = subprocess.run([sys.executable, "-m", "skyward.cli", "status", cluster], capture_output=True,
                                   text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
            polls.append(shown.returncode)
            done.wait(0.5)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        alive = wait_gone(pids, 30)
    finally:
        done.set()
        poller.join(60)
    assert len(polls) >= 2, "status was not polled while the cluster idled"
    assert alive == [], "a cluster polled by `skyward status` never autostopped"
    assert [s.status for s in manage.status([cluster])] == ["STOPPED"]


def test_autostop_set_on_a_running_cluster_is_taken_by_its_workers_at_once(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:  # no autostop
        pids = worker_pid() @ pool
    assert manage.autostop(cluster, 0.05) == []  # 3 s, `skyward autostop NAME -i 0.05`
    assert wait_gone(pids, 20) == [], "the running workers did not take the new autostop"
    [state] = manage.status([cluster])
    assert (state.status, state.record.idle_minutes) == ("STOPPED", 0.05)


def test_an_attached_client_keeps_autostop_from_firing(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, idle_minutes=0.03, **shape) as pool:  # 1.8 s
        pids = worker_pid() @ pool
        time.sleep(4)
        assert worker_pid() @ pool == pids


CONCURRENT = textwrap.dedent("""
    import sys
    import skyward as sky
    try:
        with sky.ComputePool(name=sys.argv[1], nodes=1, console=False) as pool:
            print("created", pool.worker_pids()[0], flush=True)
    except sky.ClusterBusy as busy:
        print("busy", busy.pid, flush=True)
""")


def test_two_launches_of_one_name_at_once_make_one_cluster(home: str) -> None:
    cluster = name()
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, cluster], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(2)]
    outs = sorted(p.communicate(timeout=120)[0].split()[0] for p in procs)
    assert outs in (["busy", "created"], ["created", "created"]), outs
    records = [r for r in manage.ClusterStore().all() if r.name == cluster]
    assert len(records) == 1 and len(records[0].workers) == 1


def test_named_pool_arguments_are_checked_before_anything_starts(home: str) -> None:
    with pytest.raises(sky.ConfigError, match="idle_minutes"):
        sky.ComputePool(nodes=1, idle_minutes=5)  # autostop needs a name
    with pytest.raises(sky.ConfigError, match="idle_minutes"):
        sky.ComputePool(name="x", nodes=1, idle_minutes=-1)
    with pytest.raises(sky.ConfigError, match="invalid down: expected False for an unnamed pool"):
        sky.ComputePool(nodes=1, down=True)
    with pytest.raises(sky.ConfigError, match="invalid down: expected True or False"):
        sky.ComputePool(name="x", nodes=1, down="yes")
    with pytest.raises(sky.ConfigError, match="cluster name"):
        sky.ComputePool(name="no spaces", nodes=1)
    with pytest.raises(sky.ClusterError, match="no cluster by this name"):
        sky.ComputePool(name="nothing-here")
    assert manage.ClusterStore().all() == []


@sky.compute
def env_value(key: str) -> str:
    return os.environ.get(key, "")


def test_the_records_hold_no_secret_and_the_sockets_are_private(home: str) -> None:
    cluster = name()
    secret = "s3cr3t-" + uuid.uuid4().hex
    image = sky.Image(env={"API_TOKEN": sky.Secret(secret), "PLAIN": "visible"})
    with sky.ComputePool(name=cluster, nodes=1, image=image, console=False) as pool:
        assert env_value("API_TOKEN") >> pool == secret  # the workers have it
    for path in Path(home).rglob("*"):
        if path.is_file() and not path.is_socket():
            assert secret.encode() not in path.read_bytes(), f"{path} holds the secret"
    record = manage.ClusterStore().get(cluster)
    assert "API_TOKEN" not in record.image.env and record.image.env["PLAIN"] == "visible"
    [sock] = Path(home).rglob("*.sock")
    assert sock.stat().st_mode & 0o777 == 0o600
    assert sock.parent.stat().st_mode & 0o777 == 0o700
    with sky.ComputePool(name=cluster, console=False) as pool:  # attached: the workers keep it
        assert env_value("API_TOKEN") >> pool == secret


def test_restarting_the_workers_of_a_cluster_replaces_them_and_down_still_ends_everything(shape: dict) -> None:
    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape) as pool:
        old = worker_pid() @ pool
    with sky.ComputePool(name=cluster, console=False) as pool:  # attached, then restarted
        pool.restart_workers()
        new = worker_pid() @ pool
    assert set(new).isdisjoint(old)
    assert wait_gone(old, 10) == []
    with sky.ComputePool(name=cluster, console=False) as pool:
        assert worker_pid() @ pool == new
    assert manage.down(cluster) == []
    assert wait_gone(new, 10) == []


def test_a_cluster_whose_creation_never_got_its_machines_is_created_afresh(home: str) -> None:
    """A client killed right after registering a new cluster (record INIT, no machines): the
    next pool of that name creates it instead of attaching to nothing."""
    from skyward.clusters.state import ClusterRecord

    manage.ClusterStore().put(ClusterRecord(name="half", id="0123456789", provider=sky.Local(), provider_name="local",
                                     nodes=2, processes=1, concurrency=1, executor="thread", accelerator=None))
    with sky.ComputePool(name="half", console=False) as pool:
        pids = worker_pid() @ pool
    assert len(set(pids)) == 2
    assert manage.status(["half"])[0].status == "UP"


def test_each_node_is_looked_at_by_its_own_worker_in_one_ask(shape: dict) -> None:
    """What a cluster page shows of a node comes from the node's first worker, asked once for
    its figures and its part of the job queue: over SSH the node's Python asks it for this
    machine, on Local this process asks it."""
    from skyward.clusters import control
    from skyward.dashboard import views
    from skyward.transport import reach

    cluster = name()
    with sky.ComputePool(name=cluster, console=False, **shape):
        pass
    try:
        record = manage.ClusterStore().get(cluster)
        assert record is not None
        for inst in record.instances:
            said = control.ask_node(reach(inst), record.pythons[inst.node],
                                    [(f"look {inst.node}", record.socket(inst.node * record.processes))])
            assert set(json.loads(said[0])) == {"cpu", "memory_used", "memory_total", "gpus", "rows", "notices"}, said
        shown = views.cluster(cluster)
        assert [n["state"] for n in shown["nodes"]] == ["up"] * NODES, shown["nodes"]
        assert all(0 <= n["cpu"] <= 100 and 0 < n["memory_used"] < n["memory_total"] for n in shown["nodes"])
        assert shown["jobs"] == []
    finally:
        assert manage.down(cluster) == []
