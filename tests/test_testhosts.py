"""Tests of the SSH test-host harness (tests/hosts/testhosts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.hosts import testhosts
from tests.hosts.conftest_fixture import test_hosts  # noqa: F401  (the shared fixture)

pytestmark = pytest.mark.skipif(
    testhosts.unavailable_reason() is not None,
    reason=str(testhosts.unavailable_reason()),
)


@pytest.fixture(scope="module")
def hosts():
    """A harness of this module's own (the shared fixture is tested apart)."""
    with testhosts.claim_slot() as slot:
        testhosts.down(slot.prefix)
        try:
            yield testhosts.up(2, prefix=slot.prefix, subnet=slot.subnet)
        finally:
            testhosts.down(slot.prefix)


def _ok(host, cmd):
    rc, out, err = host.run(cmd)
    assert rc == 0, f"{host.name}: {cmd!r} -> rc={rc} stderr={err!r}"
    return out


def _wait_for(pred, timeout=5.0):
    """Poll ``pred`` until it is truthy (a process started in the background
    over ssh may not have exec'd yet when ssh returns)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def test_two_hosts_with_different_ips(hosts):
    h1, h2 = hosts
    assert h1.ip != h2.ip
    assert h1.netns != h2.netns and h1.name != h2.name
    assert (h1.port, h1.user) == (22, "root")
    assert h1.home != h2.home and h1.workdir != h2.workdir
    names = testhosts._netns_list()
    assert h1.netns in names and h2.netns in names
    for h in hosts:
        assert h.sshd_pid is not None
        assert Path(h.key_path).is_file() and Path(h.known_hosts).is_file()


def test_ssh_works_and_shows_own_address(hosts):
    for h in hosts:
        out = _ok(h, "hostname; ip -4 -o addr show dev eth0")
        name, addr = out.split("\n", 1)
        assert name == h.name
        assert f"inet {h.ip}/" in addr
        # the same interpreter as the tests, at the same path
        assert _ok(h, f"{h.python} -c 'import sys; print(sys.prefix)'").strip() == sys.prefix
        out = _ok(h, "python3 -c 'import sys; print(sys.prefix)'").strip()
        assert os.path.realpath(out) == os.path.realpath(sys.prefix)


def test_host_key_is_verified(hosts, tmp_path):
    h1, h2 = hosts
    # host 1's address with host 2's key: ssh must refuse
    key2 = Path(h2.known_hosts).read_text().split(" ", 1)[1]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{h1.ip} {key2}")
    argv = h1.ssh_argv("true")
    argv[argv.index(f"UserKnownHostsFile={h1.known_hosts}")] = f"UserKnownHostsFile={wrong}"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255
    assert "host key" in proc.stderr.lower() or "identification" in proc.stderr.lower()
    # an unknown host is refused too (StrictHostKeyChecking=yes)
    wrong.write_text("")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255


def test_home_and_workdir_are_private(hosts):
    h1, h2 = hosts
    marker = f"marker-{uuid.uuid4().hex}"
    _ok(h1, f"mkdir -p ~/.cache && echo one > ~/.cache/{marker} && echo w > {h1.work_mount}/{marker}")
    assert _ok(h1, f"cat ~/.cache/{marker}") == "one\n"
    assert Path(h1.home, ".cache", marker).read_text() == "one\n"
    assert Path(h1.workdir, marker).read_text() == "w\n"
    rc, _, _ = h2.run(f"test -e ~/.cache/{marker} || test -e {h2.work_mount}/{marker}")
    assert rc == 1
    assert not Path(h2.home, ".cache", marker).exists()
    assert not Path("/root/.cache", marker).exists()
    assert not Path(h1.work_mount, marker).exists()
    # the shared interpreter is read-only inside the hosts
    prefix = os.path.realpath(sys.prefix)
    if prefix.startswith(h1.home_mount + "/"):
        rc, _, err = h1.run(f"touch {prefix}/skyward-testhosts-probe")
        assert rc != 0 and "read-only" in err.lower()


def test_hosts_reach_each_other(hosts):
    h1, h2 = hosts
    code = (
        "import socket,sys; s=socket.create_connection((sys.argv[1], 22), 5); "
        "print(s.recv(4).decode())"
    )
    assert _ok(h1, f"python3 -c '{code}' {h2.ip}").strip() == "SSH-"
    assert _ok(h2, f"python3 -c '{code}' {h1.name}").strip() == "SSH-"  # /etc/hosts
    assert f"default via {h1.bridge_ip} " in _ok(h1, "ip -4 route show default")


def test_processes_are_found_per_host(hosts):
    h1, h2 = hosts
    tag = str(4000 + os.getpid() % 1000)
    _ok(h1, f"setsid nohup sleep {tag}.5 >/dev/null 2>&1 < /dev/null &")
    pids = _wait_for(lambda: h1.processes(rf"^sleep {tag}\.5$"))
    assert len(pids) == 1
    assert h2.processes(rf"sleep {tag}") == []
    assert all("sshd" not in c for c in h1.process_cmdlines().values())
    assert h1.kill_processes(rf"^sleep {tag}\.5$") == pids
    assert _wait_for(lambda: not h1.processes(rf"sleep {tag}"))


def test_down_removes_everything():
    with testhosts.claim_slot() as slot:
        p = slot.prefix
        testhosts.down(p)
        hosts = testhosts.up(1, prefix=p, subnet=slot.subnet)
        (h,) = hosts
        pid = h.sshd_pid
        assert pid is not None
        _ok(h, "setsid nohup sleep 4321 >/dev/null 2>&1 < /dev/null &")
        assert _wait_for(lambda: h.processes("sleep 4321"))
        testhosts.down(p)
        assert h.netns not in testhosts._netns_list()
        links = testhosts._link_names()
        assert h.veth not in links and f"{p}-br0" not in links
        assert not Path(h.dir).exists()
        assert not testhosts._alive(pid)
        testhosts.down(p)  # idempotent

        # leftovers of a crashed `up`: a namespace and a bridge, no files
        subprocess.run(["ip", "netns", "add", f"{p}-h3"], check=True)
        subprocess.run(["ip", "link", "add", f"{p}-br0", "type", "bridge"], check=True)
        with pytest.raises(testhosts.HarnessError):
            testhosts.up(1, prefix=p, subnet=slot.subnet)
        testhosts.down(p)
        assert f"{p}-h3" not in testhosts._netns_list()
        assert f"{p}-br0" not in testhosts._link_names()


def test_shared_fixture(test_hosts):  # noqa: F811
    assert len(test_hosts) == 2
    assert len({h.ip for h in test_hosts}) == 2
    for h in test_hosts:
        assert _ok(h, "hostname").strip() == h.name


def test_a_slot_is_waited_for_when_every_slot_is_held():
    """Several suites on one machine can hold every slot: a claim then waits for one, and only
    a claim that may not wait fails, saying so (two suites beside four sessions' hosts once took
    all 8 slots and errored every test of this file)."""
    prefix = f"skyw{uuid.uuid4().hex[:4]}"
    code = ("import sys; from tests.hosts import testhosts\n"
            f"with testhosts.claim_slot(1, prefix={prefix!r}, wait=0):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(testhosts.HarnessError, match="all 1 test-host slots are in use"):
            with testhosts.claim_slot(1, prefix=prefix, wait=0):
                pass
        holder.stdin.close()  # the holder exits, and its lock goes with it
        with testhosts.claim_slot(1, prefix=prefix, wait=60) as slot:
            assert slot.prefix == f"{prefix}0"
    finally:
        holder.kill()
        holder.wait()
        (testhosts.DEFAULT_BASE / f"slot-{prefix}0.lock").unlink(missing_ok=True)
