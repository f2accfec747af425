"""The SSH provider against real sshd test hosts (network namespaces, one IP address each).

The hosts share this machine's interpreter (read-only) but not its home or work directory,
and they cannot reach the internet: packages come from a wheelhouse built once per session
on this machine under /tmp (which the hosts share) and are installed with ``no_index=True``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from skyward.providers.ssh import SSH
from skyward.transport.base import WorkerLaunch
from tests.hosts.conftest_fixture import ssh_provider, venv_site_env, wheelhouse  # noqa: F401  (wheelhouse is a fixture)

ABSENT_PACKAGE = "tomli"  # in the wheelhouse, but neither here nor on the hosts


# -- shared helpers (test_ssh_errors.py imports them) -----------------------------------------------


def unique_image(**fields) -> sky.Image:
    """An image no earlier test built: its environment on the hosts starts cold."""
    env = dict(fields.pop("env", {}))
    env["SKYWARD_TEST_RUN"] = uuid.uuid4().hex
    return sky.Image(env=env, **fields)


def leftovers(hosts, pattern: str = r"skyward") -> dict[str, dict[int, str]]:
    """Processes matching ``pattern`` still running on each host (empty when all is clean)."""
    found = {h.name: h.process_cmdlines(pattern) for h in hosts}
    return {name: procs for name, procs in found.items() if procs}


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def pool_on(hosts, wheelhouse: str, image: sky.Image, events: list | None = None, provider: SSH | None = None,
            **kwargs) -> sky.ComputePool:
    return sky.ComputePool(provider=provider or ssh_provider(hosts, wheelhouse), nodes=len(hosts), image=image,
                           console=False, on_event=None if events is None else events.append, **kwargs)


# -- tasks (self-contained: they are pickled by value and run on the hosts) -------------------------


@sky.compute
def add(a: int, b: int) -> int:
    return a + b


@sky.compute
def square(x: int) -> int:
    return x * x


@sky.compute
def whereabouts() -> dict:
    import socket

    info = sky.instance_info()
    return {"host": socket.gethostname(), "node": info.node, "python": sys.executable,
            "head": info.head_addr, "peers": [(p.node, p.addr) for p in info.peers]}


@sky.compute
def absent_package_version() -> str:
    import tomli

    return tomli.__name__ + " from " + os.path.dirname(tomli.__file__)


# -- a pool of two hosts -----------------------------------------------------------------------------


def test_cold_pool_builds_the_env_runs_every_operator_and_a_warm_pool_starts_faster(test_hosts, wheelhouse):
    hosts = test_hosts[:2]
    for h in hosts:  # the package really is new to the hosts
        rc, _, _ = h.run(f"{h.python} -c 'import {ABSENT_PACKAGE}'")
        assert rc != 0
    image = unique_image(pip=[ABSENT_PACKAGE])

    cold_events: list = []
    started = time.monotonic()
    with pool_on(hosts, wheelhouse, image, cold_events) as pool:
        cold = time.monotonic() - started
        where = whereabouts() @ pool
        assert [w["host"] for w in where] == [h.name for h in hosts]
        assert all("/envs/" in w["python"] for w in where)  # the built venv, not the host's Python
        assert [w["peers"] for w in where] == [[(0, hosts[0].ip), (1, hosts[1].ip)]] * 2
        assert {w["head"] for w in where} == {hosts[0].ip}
        assert all(v.startswith(f"{ABSENT_PACKAGE} from /root/.skyward/envs/") for v in absent_package_version() @ pool)

        assert add(2, 3) >> pool == 5
        assert (add(1, 1) & add(2, 2) & square(3)) >> pool == (2, 4, 9)
        assert sky.gather(*(square(i) for i in range(6))) >> pool == [0, 1, 4, 9, 16, 25]
        assert sorted(sky.gather(*(square(i) for i in range(4)), stream=True, ordered=False) >> pool) == [0, 1, 4, 9]
        future = add(20, 22) > pool
        assert future.result(timeout=30) == 42
        assert pool.map(square, range(8)) == [i * i for i in range(8)]
        pids = pool.worker_pids()
        assert all(isinstance(p, int) for p in pids)
    assert not leftovers(hosts)

    warm_events: list = []
    started = time.monotonic()
    with pool_on(hosts, wheelhouse, image, warm_events) as pool:
        warm = time.monotonic() - started
        assert absent_package_version() @ pool
    assert not leftovers(hosts)

    def logs(events: list) -> str:
        return "\n".join(e.line for e in events if isinstance(e, ev.NodeLog))

    assert "::warm::" not in logs(cold_events) and "::step:: pip" in logs(cold_events)
    assert logs(warm_events).count("::warm::") == 2 and "::step:: pip" not in logs(warm_events)
    # (How much faster a warm start is, is the benchmark's to say: bench/run.py --only ssh.)
    print(f"\nSSH pool start, 2 hosts: cold {cold:.2f}s, warm {warm:.2f}s ({cold / warm:.1f}x)")


def test_a_warm_start_runs_two_commands_on_a_host_the_environment_build_and_the_worker(test_hosts, wheelhouse):
    # Each command is a session of the host's sshd, its shells and their processes: the CPU a
    # host pays to start. (sshd, LogLevel VERBOSE, logs each: "Starting session: command ...")
    host = test_hosts[:1]
    with pool_on(host, wheelhouse, sky.Image()):  # the host is prepared (warm from now on)
        pass
    log = Path(host[0].dir, "sshd.log")
    before = log.read_text().count("Starting session: command")
    with pool_on(host, wheelhouse, sky.Image()) as pool:
        assert add(1, 2) >> pool == 3
        assert log.read_text().count("Starting session: command") - before == 2
    assert not leftovers(host)


def test_include_env_and_setup_reach_the_tasks_and_setup_runs_once(test_hosts, wheelhouse, tmp_path):
    hosts = test_hosts[:2]
    tag = uuid.uuid4().hex[:10]
    module = f"skyprobe_{tag}"
    package = tmp_path / module
    package.mkdir()
    (package / "__init__.py").write_text(f"from .data import VALUE\nTAG = {tag!r}\n")
    (package / "data.py").write_text("VALUE = 'shipped with include'\n")
    marker = f"setup-{tag}.log"
    image = unique_image(include=[str(package)], env={"PROBE_TAG": tag},
                         setup=[f'echo "setup ran" >> /opt/skyward-work/{marker}'])

    @sky.compute
    def probe(name: str) -> tuple:
        mod = importlib.import_module(name)
        return mod.TAG, mod.VALUE, os.environ.get("PROBE_TAG")

    for _ in range(2):
        with pool_on(hosts, wheelhouse, image) as pool:
            assert probe(module) @ pool == [(tag, "shipped with include", tag)] * 2
    for h in hosts:
        assert Path(h.workdir, marker).read_text().splitlines() == ["setup ran"], h.name
    assert not leftovers(hosts)


def test_changed_include_files_are_synced_on_the_next_start(test_hosts, wheelhouse, tmp_path):
    hosts = test_hosts[:1]
    module = tmp_path / f"skyprobe_{uuid.uuid4().hex[:10]}.py"
    module.write_text("VALUE = 1\n")

    @sky.compute
    def value(name: str) -> int:
        return importlib.import_module(name).VALUE

    for expected in (1, 2):
        module.write_text(f"VALUE = {expected}\n")
        with pool_on(hosts, wheelhouse, sky.Image(include=[str(module)])) as pool:
            assert value(module.stem) >> pool == expected


def test_ddp_with_gloo_across_two_hosts_keeps_parameters_identical(test_hosts, wheelhouse):
    hosts = test_hosts[:2]
    # torch is preinstalled in the hosts' Python: take it from there instead of installing it.
    provider = ssh_provider(hosts, wheelhouse, system_site_packages=["torch", "numpy"])

    @sky.compute
    def train(steps: int) -> dict:
        import socket

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        rank = dist.get_rank()
        torch.manual_seed(100 + rank)  # different initial weights: DDP must make them agree
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(rank)  # and each rank sees different data
        for _ in range(steps):
            x = torch.randn(32, 8, generator=data)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        info = sky.instance_info()
        return {
            "rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend(),
            "host": socket.gethostname(), "torch": torch.__file__,
            "params": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
            "head": info.head_addr, "peers": [p.addr for p in info.peers],
        }

    # The hosts have a resolver configured but no route to it, and torch's store looks up the
    # name of every peer socket: without this each lookup waits out glibc's default 2 x 5 s.
    # In a fresh venv torch and numpy are there, not in the base interpreter the hosts use.
    image = unique_image(env={"RES_OPTIONS": "timeout:1 attempts:1", **venv_site_env("torch", "numpy")})
    with pool_on(hosts, wheelhouse, image, provider=provider, plugins=[sky.plugins.torch(backend="gloo")]) as pool:
        results = train(5) @ pool
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["world"] for r in results} == {2} and {r["backend"] for r in results} == {"gloo"}
    assert [r["host"] for r in results] == [h.name for h in hosts]
    assert all(r["peers"] == [hosts[0].ip, hosts[1].ip] and r["head"] == hosts[0].ip for r in results)
    assert hosts[0].ip != hosts[1].ip
    assert all("/envs/" not in r["torch"] for r in results)  # the host's torch, not a new install
    assert results[0]["params"] == results[1]["params"]
    assert not leftovers(hosts)


# -- the worker's channel ----------------------------------------------------------------------------


def _transport(host):
    from skyward.transport.ssh import SSHTransport

    return SSHTransport(host.ip, port=host.port, user=host.user, key_filename=host.key_path,
                        known_hosts=[host.known_hosts], connect_timeout=5)


def test_channel_carries_bytes_both_ways_unchanged_despite_login_script_noise(test_hosts):
    host = test_hosts[0]
    bashrc = Path(host.home, ".bashrc")
    saved = bashrc.read_bytes() if bashrc.exists() else None
    bashrc.write_text("echo 'noise from .bashrc'\n")  # printed on stdout by every SSH command
    transport = _transport(host)
    try:
        channel = transport.start(WorkerLaunch(("cat",)))
        payload = os.urandom(8 * 1024 * 1024)
        writer = threading.Thread(target=lambda: (channel.stdin.write(payload), channel.stdin.close()))
        writer.start()
        received = bytearray()
        while chunk := channel.stdout.read(1 << 20):
            received += chunk
        writer.join()
        assert bytes(received) == payload
        assert channel.wait(10) == 0
        assert channel.stderr.readline() == b"noise from .bashrc\n"  # moved to diagnostics
    finally:
        transport.close()
        if saved is None:
            bashrc.unlink()
        else:
            bashrc.write_bytes(saved)


def test_channel_kill_stops_the_whole_process_group_on_the_host(test_hosts):
    host = test_hosts[0]
    transport = _transport(host)
    try:
        channel = transport.start(WorkerLaunch(("bash", "-c", "sleep 4141 & sleep 4242 & wait")))
        assert isinstance(channel.pgid, int)
        assert wait_until(lambda: len(host.processes(r"^sleep 4[12]4[12]")) == 2, 10)
        channel.kill()
        assert channel.confirm_gone(5)
        assert host.processes(r"sleep 4[12]4[12]") == []
        assert channel.wait(5) is not None
    finally:
        transport.close()


def test_a_process_group_whose_only_member_is_a_zombie_counts_as_ended(test_hosts):
    """An ended command's group often keeps a zombie for a while (its dead man's switch, adopted
    by an init that reaps when it gets round to it): nothing of it runs, so it is gone. The test
    hosts share this machine's process ids: the zombie is a child of this test, not reaped."""
    host = test_hosts[0]
    transport = _transport(host)
    ended = subprocess.Popen(["true"], process_group=0)
    try:
        os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)  # it has exited; it stays a zombie
        assert transport.kill_group(ended.pid, 3.0) is True
        assert transport.kill_group(ended.pid, 3.0, tree=uuid.uuid4().hex) is True
    finally:
        ended.wait()
        transport.close()


def test_a_stream_not_confirmed_gone_still_leaves_nothing_of_its_group(test_hosts):
    """``confirm_gone=False`` (skyward's job follower) skips the round trip that sees the group
    gone, not its end: the stream's dead man's switch ends it as the channel closes. The test
    hosts share this machine's process ids: the group is looked for here."""
    host = test_hosts[0]
    transport = _transport(host)
    said: list[str] = []
    try:
        # (the command is `exec`ed by the stream's shell: its $$ leads the session's group)
        assert transport.stream("echo $$", lambda kind, line: said.append(line), confirm_gone=False) == 0
        group = int(said[-1])

        def members() -> list[str]:  # (its running members: a zombie runs nothing)
            running = []
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = stat.read_text().rsplit(") ", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if fields[2] == str(group) and fields[0] not in ("Z", "X"):
                    running.append(stat.parent.name)
            return running

        assert wait_until(lambda: members() == [], 10), members()
    finally:
        transport.close()


def test_a_connection_warmed_ahead_is_the_one_reach_hands_out_once(test_hosts):
    """``skyward exec NAME`` starts the handshakes before the pool's modules load: the pool's
    ``reach`` gets that connection (once; the next is a fresh one), and the warm ones no one
    took are closed by ``release``."""
    from skyward.machine import Instance, SSHAddress
    from skyward.transport import reach, warm

    host = test_hosts[0]
    inst = Instance("h0", 0, host.ip, ssh=SSHAddress(host.ip, host.user, host.port, host.key_path,
                                                      (host.known_hosts,), connect_timeout=5))
    warm.warm([inst])
    first = reach(inst)
    try:
        assert first.run("echo warm", timeout=30).stdout.strip() == "warm"
        assert reach(inst) is not first and warm.take(inst) is None
        warm.warm([inst])
        warm.release()
        assert warm.take(inst) is None
    finally:
        first.close()


def test_the_connection_sends_small_packets_at_once_nagle_off(test_hosts):
    """Every exchange over the connection is small packets (a command's exec, a task's frames):
    with Nagle's algorithm on (paramiko's own sockets), one sent while the last is not yet
    acknowledged waited for the host's delayed ACK, up to 40 ms (the handshake took 70-120 ms
    instead of 20-40, each exec 45 ms instead of 3, on the test hosts)."""
    import gc

    from skyward.machine import Instance, SSHAddress
    from skyward.transport import reach

    host = test_hosts[0]
    transport = reach(Instance("h0", 0, host.ip, ssh=SSHAddress(host.ip, host.user, host.port, host.key_path,
                                                                 (host.known_hosts,), connect_timeout=5)))
    try:
        assert transport.run("echo up", timeout=30).stdout.strip() == "up"
        ours = []
        for obj in gc.get_objects():
            if issubclass(type(obj), socket.socket) and obj.fileno() != -1 and obj.type == socket.SOCK_STREAM:
                with contextlib.suppress(OSError):
                    if obj.getpeername() == (host.ip, host.port):
                        ours.append(obj.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        assert ours and all(ours), ours
    finally:
        transport.close()


# -- the client killed -------------------------------------------------------------------------------

CLIENT = r"""
import json, sys
import skyward as sky
from skyward.providers.ssh import SSH

cfg = json.loads(sys.argv[1])

@sky.compute
def hang(tag):
    import subprocess, time
    subprocess.Popen(["sleep", "4343"])
    with open(f"/opt/skyward-work/{tag}-{sky.instance_info().node}", "w") as f:
        f.write("running")
    time.sleep(600)

provider = SSH(cfg["hosts"], user=cfg["user"], key=cfg["key"], known_hosts=cfg["known_hosts"],
               find_links=[cfg["wheelhouse"]], no_index=True)
with sky.ComputePool(provider=provider, nodes=len(cfg["hosts"]), idle_timeout=cfg["idle_timeout"],
                     console=False) as pool:
    hang(cfg["tag"]) @ pool
"""


def test_a_killed_client_leaves_no_worker_on_any_host(test_hosts, wheelhouse, tmp_path):
    hosts = test_hosts[:2]
    tag = f"running-{uuid.uuid4().hex[:8]}"
    idle_timeout = 3.0
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    cfg = {"hosts": [h.ip for h in hosts], "user": hosts[0].user, "key": hosts[0].key_path,
           "known_hosts": hosts[0].known_hosts_all, "wheelhouse": wheelhouse, "tag": tag,
           "idle_timeout": idle_timeout}
    client = subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        running = wait_until(lambda: all(Path(h.workdir, f"{tag}-{i}").exists() for i, h in enumerate(hosts)), 90)
        assert running, client.stdout.read() if client.poll() is not None else "tasks did not start"
        assert all(h.processes("skyward.worker") and h.processes(r"^sleep 4343") for h in hosts)
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
        client.stdout.close()
    killed = time.monotonic()
    gone = wait_until(lambda: not leftovers(hosts, r"skyward\.worker|^sleep 4343"), idle_timeout + 5)
    took = time.monotonic() - killed
    assert gone, leftovers(hosts, r"skyward\.worker|^sleep 4343")
    print(f"\nworkers gone {took:.2f}s after the client was killed (idle_timeout={idle_timeout:g}s)")


# -- ~/.ssh/config: a host behind a jump host ----------------------------------------------------------


@sky.compute
def connected_from() -> str:
    import os

    return os.environ.get("SSH_CONNECTION", "").split()[0]  # the address the host's sshd saw


def behind_bastion_config(home, monkeypatch, target, bastion) -> None:  # type: ignore[no-untyped-def]
    """A ~/.ssh/config (in ``home``, made $HOME) where "behind" is the target, reached by
    ProxyJump through the host "bastion"."""
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text(
        f"Host behind\n  HostName {target.ip}\n  User {target.user}\n  IdentityFile {target.key_path}\n"
        f"  ProxyJump bastion\n\n"
        f"Host bastion\n  HostName {bastion.ip}\n  User {bastion.user}\n  IdentityFile {bastion.key_path}\n")
    monkeypatch.setenv("HOME", str(home))


def test_proxy_jump_in_ssh_config_reaches_the_host_through_the_bastion(test_hosts, wheelhouse, tmp_path, monkeypatch):
    bastion, target = test_hosts[0], test_hosts[1]
    behind_bastion_config(tmp_path, monkeypatch, target, bastion)
    provider = SSH(["behind"], known_hosts=target.known_hosts_all, find_links=[wheelhouse], no_index=True,
                   connect_timeout=5)
    jump = provider.jumps[0]
    assert jump is not None and (jump.host, jump.user, jump.key) == (bastion.ip, bastion.user, bastion.key_path)
    with sky.ComputePool(provider=provider, nodes=1, image=unique_image(), console=False) as pool:
        # The target's sshd saw the bastion connect, not this machine (target.bridge_ip).
        assert connected_from() >> pool == bastion.ip
    assert not leftovers([target])


def test_a_host_reachable_only_through_a_jump_host(test_hosts, wheelhouse, tmp_path, monkeypatch):
    bastion, target = test_hosts[0], test_hosts[1]
    behind_bastion_config(tmp_path, monkeypatch, target, bastion)
    # The target's only link is a private one to the bastion: this machine has no route to it.
    with target.behind(bastion) as bastion_side:
        with pytest.raises(OSError):
            socket.create_connection((target.ip, 22), timeout=3).close()
        rc, out, err = bastion.run(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{target.ip}/22 && head -c 4 <&3'")
        assert rc == 0 and out.startswith("SSH-"), out + err  # ...the bastion reaches its sshd
        # A pool that goes straight to the target fails, saying where and why, and leaves nothing.
        direct = SSH([target.ip], user=target.user, key=target.key_path, known_hosts=target.known_hosts_all,
                     find_links=[wheelhouse], no_index=True, connect_timeout=3)
        started = time.monotonic()
        with pytest.raises(sky.SkywardError, match=target.ip) as info:
            with sky.ComputePool(provider=direct, nodes=1, image=unique_image(), console=False, start_timeout=30):
                pass
        assert time.monotonic() - started < 60, info.value
        assert f"connect failed: no answer from {target.ip}:22" in str(info.value) or \
            f"connect failed: cannot reach {target.ip}:22" in str(info.value), info.value
        print(f"\nwithout the jump host: {info.value}")
        # Through the jump host named in ~/.ssh/config, the same host runs the pool.
        provider = SSH(["behind"], known_hosts=target.known_hosts_all, find_links=[wheelhouse], no_index=True,
                       connect_timeout=5)
        with sky.ComputePool(provider=provider, nodes=1, image=unique_image(), console=False) as pool:
            assert connected_from() >> pool == bastion_side  # it came over the private link
            assert add(2, 3) >> pool == 5
        assert not leftovers([target])
    assert not leftovers([target])


def test_proxy_command_in_ssh_config_carries_the_connection(test_hosts, wheelhouse, tmp_path, monkeypatch):
    bastion, target = test_hosts[0], test_hosts[1]
    (tmp_path / ".ssh").mkdir()
    via = (f"ssh -i {bastion.key_path} -o UserKnownHostsFile={bastion.known_hosts_all} -o BatchMode=yes "
           f"{bastion.user}@{bastion.ip} -W %h:%p")
    (tmp_path / ".ssh" / "config").write_text(
        f"Host behind\n  HostName {target.ip}\n  User {target.user}\n  IdentityFile {target.key_path}\n"
        f"  ProxyCommand {via}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    provider = SSH(["behind"], known_hosts=target.known_hosts_all, find_links=[wheelhouse], no_index=True,
                   connect_timeout=5)
    assert provider.proxy_commands == (via.replace("%h", target.ip).replace("%p", "22"),)
    with sky.ComputePool(provider=provider, nodes=1, image=unique_image(), console=False) as pool:
        assert connected_from() >> pool == bastion.ip
    assert not leftovers([target])
