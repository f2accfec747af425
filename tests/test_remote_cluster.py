"""Two computes in one program (skyward.torch.Cluster) and copies between their devices, on the
Local provider: the bytes go worker to worker (the client sees none of them), each node's
operations stay in order, and leaving the cluster tears every compute down.

Internals on purpose, through ``skyward.testing``: the client's device records and the node's
sessions are read to check what no public call shows: that nothing accumulates, and which
peer a copy goes to."""

from __future__ import annotations

import copy
import os
import signal
import socket
import threading
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import skyward as sky  # noqa: E402
from skyward.torch import Cluster, Compute, compute  # noqa: E402
from skyward.testing import connection, device_record  # noqa: E402


def received(*computes: Compute) -> int:
    """Bytes the client has read from these computes' workers."""
    return sum(connection(c.pool, 0).received_bytes for c in computes)


def count_calls(devices: list) -> list:
    """Record every round trip (a call the client waits for) these devices make."""
    calls: list = []
    for d in devices:
        dev = device_record(d)
        real = dev.link.call
        dev.link.call = lambda fn, args, real=real, dev=dev: calls.append((dev.index, args[3])) or real(fn, args)
    return calls


def bytes_in_flight_to(port: int) -> int:
    """Bytes sent to local TCP port ``port`` and not yet read there: what waits in the send
    queues of the connections to it and in its receive queues (/proc/net/tcp and tcp6)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                _, local, remote, state, queues = line.split()[:5]
                if state == "0A":  # listening
                    continue
                sent, unread = (int(q, 16) for q in queues.split(":"))
                total += unread if int(local.rsplit(":", 1)[1], 16) == port else 0
                total += sent if int(remote.rsplit(":", 1)[1], 16) == port else 0
    return total


def wait_until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_seed_example_with_a_small_causal_lm_syncs_weights_node_to_node() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, 128, (4, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a copy through the client would warn)
        with Cluster(Compute(name="trainer", provider=sky.Local()), Compute(name="ref", provider=sky.Local())) as (
            trainer, ref,
        ):
            model.to(trainer.device("cpu"))
            ref_model = copy.deepcopy(model).to(ref.device("cpu"))
            assert {p.device for p in ref_model.parameters()} == {ref.device("cpu")}
            before = received(trainer, ref)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            x = ids.to(trainer.device("cpu"))
            for _ in range(3):
                opt.zero_grad()
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
                    q.data.copy_(p.data)
            torch.sky.synchronize()
            moved = received(trainer, ref) - before
            assert moved < size / 20, (moved, size)  # three syncs of every weight, none through here
            assert all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(model.parameters(), ref_model.parameters()))
            # and the trained weights differ from where they started: the copies carried the steps
            torch.manual_seed(0)
            fresh = transformers.GPT2LMHeadModel(config)
            assert not torch.equal(fresh.lm_head.weight, ref_model.lm_head.weight.cpu())


def test_copies_both_ways_between_views_and_slices_with_no_round_trip() -> None:
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        x = torch.arange(48.0).reshape(6, 8)
        sa = x.to(da)
        sb = torch.zeros(8, 6, device=db)
        torch.sky.synchronize()
        sb[0].copy_(sa[1:3, 2:5].reshape(-1)[:6])  # warms the route (one probe per pair)
        sa.zero_().copy_(sb.t() * 0 + 1)
        calls = count_calls([da, db])
        sa.copy_(x.to(da))  # (client -> a: queued too)
        sb[2:4].copy_(sa[::3, ::2].reshape(2, 4).repeat(1, 2)[:, :6])  # a -> b, views on both sides
        sa[5, :6].copy_(sb[2])[:2].mul_(10)  # b -> a, then an op after it on a
        back = sb.to(da)  # a new tensor from b on a
        assert calls == []  # none of that waited for anything
        got_b, got_a, got_back = sb.cpu(), sa.cpu(), back.cpu()
        expect_b = torch.zeros(8, 6)
        expect_b[0] = torch.tensor([10.0, 11, 12, 18, 19, 20])
        expect_b[2:4] = x[::3, ::2].reshape(2, 4).repeat(1, 2)[:, :6]
        expect_a = x.clone()
        expect_a[5, :6] = expect_b[2]
        expect_a[5, :2] *= 10
        assert torch.equal(got_b, expect_b)
        assert torch.equal(got_a, expect_a)
        assert torch.equal(got_back, expect_b) and back.device == da
        with pytest.raises(RuntimeError, match="must match|broadcast"):
            sa[5].copy_(sb[2])  # 8 <- 6: refused here, at once, as torch refuses it


def test_a_large_copy_leaves_the_clients_memory_flat() -> None:
    n = 64 << 20  # 64 Mi float32: 256 MiB
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        big = torch.ones(n, device=da).mul_(3.0)
        torch.sky.synchronize()
        start_rss, start_bytes = rss(), received(a, b)
        peak = [start_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            copy_b = big.to(db)
            total = copy_b.sum().item()
        finally:
            done.set()
            sampler.join()
        assert total == 3.0 * n
        assert peak[0] - start_rss < 32 << 20, (peak[0] - start_rss)  # far below the 256 MiB moved
        assert received(a, b) - start_bytes < 64 << 10


def test_a_sync_on_one_node_does_not_wait_for_the_other() -> None:
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        m = torch.randn(600, 600, device=da)
        torch.sky.synchronize()
        for _ in range(60):  # several seconds of work queued on a
            m = (m @ m).tanh_()
        started = time.monotonic()
        assert torch.ones(3, device=db).sum().item() == 3.0
        b_took = time.monotonic() - started
        m.sum().item()
        a_took = time.monotonic() - started
        assert b_took < a_took / 3, (b_took, a_took)


def test_the_peer_port_listens_on_the_peer_address_and_refuses_strangers() -> None:
    with Compute() as node:
        dev = device_record(node.device())
        address, port = dev.peer["address"], dev.peer["port"]
        assert address == node.pool.instances[0].private_addr == "127.0.0.1"
        with open("/proc/net/tcp") as f:
            listening = [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in listening  # bound to 127.0.0.1 only
        assert f"00000000:{port:04X}" not in listening
        with socket.create_connection((address, port), timeout=5) as s:
            s.recv(32)  # the nonce
            s.sendall(b"\0" * 40)  # a wrong proof
            s.settimeout(5)
            assert s.recv(16) == b""  # closed without a word
        assert torch.ones(2, device=node.device()).sum().item() == 2.0


def test_a_node_lost_before_its_copy_arrives_raises_worker_lost() -> None:
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        m = torch.randn(600, 600, device=da)
        target = torch.zeros(600, 600, device=db)
        target.copy_(m)  # the route is set up (the two workers are connected)
        torch.sky.synchronize()
        # a is frozen before it is asked for anything more: the work and the copy reach its
        # socket and wait there, so it dies with the copy not sent, on a fast machine or a slow one
        pid = a.pool.worker_pids()[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            m = (m @ m).tanh_()
            target.copy_(m)
        finally:
            os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(sky.WorkerLost, match="SIGKILL"):
            target.sum().item()
        assert time.monotonic() - started < 15


def test_a_receiver_lost_mid_copy_raises_worker_lost_on_both_sides() -> None:
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        big = torch.ones(64 << 20, device=da)  # 256 MiB
        small = torch.zeros(4, device=db)
        small.copy_(big[:4])  # the route is set up
        torch.sky.synchronize()
        # b is frozen first: it reads nothing, so a's send fills the sockets' buffers (a few MiB)
        # and waits, mid-copy, until b dies, however fast the machine
        pid, port = b.pool.worker_pids()[0], device_record(db).peer["port"]
        os.kill(pid, signal.SIGSTOP)
        try:
            big.to(db)
            sending = wait_until(lambda: bytes_in_flight_to(port) > 64 << 10, timeout=60)
        finally:
            os.kill(pid, signal.SIGKILL)
        assert sending, "a never began sending to b"
        with pytest.raises(sky.WorkerLost, match="SIGKILL"):
            small.sum().item()  # on b itself
        with pytest.raises(sky.WorkerLost, match="SIGKILL"):
            big.sum().item()  # on a, whose sends to b broke


def test_leaving_the_cluster_tears_every_compute_down_on_every_exit_path() -> None:
    first, second = Compute(), Compute()
    with pytest.raises(ZeroDivisionError):
        with Cluster(first, second) as (x, y):
            assert x.pool.is_open and y.pool.is_open
            pids = [x.pool.worker_pids()[0], y.pool.worker_pids()[0]]
            1 / 0
    assert not first.pool.is_open and not second.pool.is_open
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"

    ok = Compute()
    broken = Compute(start_timeout=10, image=sky.Image(env={"SKYWARD_BAD": "1"}),
                     plugins=[sky.Plugin("boom", around_app=_failing_app)])
    with pytest.raises(sky.PluginError, match="boom"):
        with Cluster(ok, broken):
            pass
    assert not ok.pool.is_open and not broken.pool.is_open


def _failing_app(info):  # type: ignore[no-untyped-def]
    raise RuntimeError("boom")


def test_async_cluster_and_pool_devices_on_one_multi_node_pool() -> None:
    import asyncio

    async def main() -> list[float]:
        async with Cluster(Compute(), Compute()) as (a, b):
            t = torch.arange(4.0).to(a.device())
            return (t.to(b.device()) * 2).tolist()

    assert asyncio.run(main()) == [0.0, 2.0, 4.0, 6.0]

    with sky.ComputePool(nodes=3, console=False) as pool:
        devs = [pool.device("cpu", node=i) for i in range(3)]
        t = torch.arange(5.0).to(devs[0])
        for i in (1, 2, 0):
            t = t.to(devs[i]) + 1
        assert t.device == devs[0] and t.tolist() == [3.0, 4.0, 5.0, 6.0, 7.0]


def test_cluster_rejects_bad_input() -> None:
    with pytest.raises(sky.ConfigError, match="computes"):
        Cluster()
    with pytest.raises(sky.ConfigError, match=r"computes\[1\]"):
        Cluster(Compute(), "not a compute")  # type: ignore[arg-type]
    c = Compute()
    with pytest.raises(sky.ConfigError, match="distinct"):
        Cluster(c, c)
    with pytest.raises(sky.ConfigError, match="nodes"):
        Compute(nodes=2)

    @compute
    def plain(node: Compute) -> str:
        return str(node.device())

    assert plain().startswith("sky:")


CTRL_C_CLIENT = """
import torch, skyward as sky
from skyward.torch import Cluster, Compute
with Cluster(Compute(), Compute()) as (a, b):
    print("PIDS", a.pool.worker_pids()[0], b.pool.worker_pids()[0], flush=True)
    da, db = a.device(), b.device()
    m = torch.randn(400, 400, device=da)
    print("RUNNING", flush=True)
    while True:
        m = (m @ m).tanh_()
        m.to(db).sum().item()
"""


def test_ctrl_c_while_two_nodes_compute_and_copy_leaves_nothing_running() -> None:
    import subprocess
    import sys

    from tests.test_lifecycle import ROOT, interactive_signals, wait_gone

    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_CLIENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, preexec_fn=interactive_signals)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("PIDS"), first + proc.stderr.read()  # type: ignore[union-attr]
    pids = [int(p) for p in first.split()[1:]]
    assert proc.stdout.readline().startswith("RUNNING")
    time.sleep(1.0)  # mid-loop: ops queued on a, copies in flight to b
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode in (-signal.SIGINT, 130), err
    assert err.count("stopped, nothing left running") == 2 and "Traceback" not in err, err  # one line per compute
    assert wait_gone(pids, 5) == []
