"""The remote ``sky`` torch device: what streaming costs the client, and training against the CPU.

    python bench/remote_device.py           # writes its section of docs/benchmarks.md
    python bench/remote_device.py --quick   # fewer steps; prints the figures only

One client process, one Local ``Compute`` (its worker is another process on this machine):

- **Client cost per queued op**: ``c = a + b`` on 16-element ``sky`` tensors, 20,000 times, each
  timed on its own (``perf_counter_ns``); p50 and p90, and ops/s over the whole loop (sends
  included). For scale, the same line on CPU tensors in the same process.
- **MNIST steps/s**: the network of SkyTorch's MNIST example, AdamW, batch 256, the batch already on the device;
  the same steps on the client's CPU and on the ``sky`` device, blocks interleaved (CPU, sky,
  sky, CPU, ...), the loss read back once at the end of each block. The ratio is sky / CPU per
  pair of neighbouring blocks, median over pairs. On this machine the worker and the client
  share 2 CPUs: the figure is the price of streaming, not a speed-up.
- **Node-to-node copy** (a ``Cluster`` of two Local computes): 64 MiB from one node's device to
  the other's, ``b = a.to(other)`` then a sync on the receiving device; against a raw TCP socket
  between the same two worker processes (one task listens and receives into fresh memory, the
  other sends from a tensor; timed from the client around the sending task, which returns once
  the receiver has every byte), and against the same copy through the client (``.cpu()`` then
  ``.to(other)``). Repetitions interleaved; medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import write_section  # noqa: E402

OWNER = "bench/remote_device.py"
TARGET_OP_US = 10.0
TARGET_STEPS = 0.7
TARGET_COPY = 0.5
COPY_BYTES = 64 << 20


def mnist_net():  # type: ignore[no-untyped-def]
    """The network of SkyTorch's MNIST example, as guides/remote_mnist.py defines it."""
    sys.path.insert(0, os.path.join(ROOT, "guides"))
    from remote_mnist import MNISTNet

    return MNISTNet()


def op_cost(device, n: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch

    a = torch.ones(16, device=device)
    b = torch.ones(16, device=device)
    for _ in range(2000):
        c = a + b
    times = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        c = a + b
        times.append(time.perf_counter_ns() - t0)
    c.sum().item()  # (every op has run: the loop's time includes sending them)
    total = time.perf_counter() - started
    times.sort()
    return {"p50_us": times[n // 2] / 1000, "p90_us": times[int(n * 0.9)] / 1000, "ops_per_s": n / total}


def steps_per_s(model, opt, x, y, n: int) -> float:  # type: ignore[no-untyped-def]
    from torch import nn

    started = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    loss.item()
    return n / (time.perf_counter() - started)


def _raw_receive(nbytes: int) -> int:
    """(On the receiving worker) listen once on 127.0.0.1, receive ``nbytes`` into fresh memory,
    answer one byte; returns the port. The receiving runs on a thread of its own."""
    import socket
    import threading

    import torch

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        buf = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(buf.numpy())
        got = 0
        while got < nbytes:
            got += conn.recv_into(view[got:], nbytes - got)
        conn.sendall(b"k")
        conn.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def _raw_send(port: int, nbytes: int) -> None:
    """(On the sending worker) send ``nbytes`` of a tensor to ``port``; return once acknowledged."""
    import socket

    import torch

    data = torch.ones(nbytes, dtype=torch.uint8)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(memoryview(data.numpy()))
        s.recv(1)


def copy_rates(quick: bool) -> dict:
    import torch

    import skyward as sky
    from skyward.torch import Cluster, Compute

    reps = 2 if quick else 7
    n = COPY_BYTES
    receive, send = sky.compute(_raw_receive), sky.compute(_raw_send)
    samples: dict[str, list[float]] = {"sky": [], "raw": [], "client": []}
    with Cluster(Compute(), Compute()) as (a, b):
        da, db = a.device(), b.device()
        src = torch.ones(n // 4, device=da)
        dst = src.to(db)  # warm: the route, both sides' memory
        torch.sky.synchronize()
        for rep in range(reps):
            order = ["sky", "raw", "client"] if rep % 2 == 0 else ["client", "raw", "sky"]
            for which in order:
                if which == "sky":
                    t0 = time.perf_counter()
                    dst = src.to(db)
                    torch.sky.synchronize(db)
                elif which == "raw":
                    port = receive(n) >> b.pool
                    t0 = time.perf_counter()
                    send(port, n) >> a.pool
                else:
                    t0 = time.perf_counter()
                    dst = src.cpu().to(db)
                    torch.sky.synchronize(db)
                samples[which].append(time.perf_counter() - t0)
                del dst
                dst = None
    return {k: n / statistics.median(v) / 1e9 for k, v in samples.items()} | {"reps": reps}


def measure(quick: bool) -> dict:
    import torch

    import skyward as sky
    from skyward.torch import Compute

    reps, steps = (1, 3) if quick else (4, 8)
    result: dict = {"load_start": os.getloadavg()}
    with Compute(provider=sky.Local()) as node:
        d = node.device("cpu")
        n = 2000 if quick else 20000
        result["sky_op"] = op_cost(d, n)
        result["cpu_op"] = op_cost("cpu", n)
        torch.manual_seed(0)
        x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
        cpu_model = mnist_net()
        sky_model = mnist_net().to(d)
        cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.002)
        sky_opt = torch.optim.AdamW(sky_model.parameters(), lr=0.002)
        sx, sy = x.to(d), y.to(d)
        # Warm both: first steps pay allocations, oneDNN's primitives and (sky) the shape plans;
        # the node's device thread reaches its steady pace after ~10 steps on this machine.
        steps_per_s(cpu_model, cpu_opt, x, y, 2 if quick else 10)
        steps_per_s(sky_model, sky_opt, sx, sy, 2 if quick else 10)
        pairs = []
        for rep in range(reps):
            order = ("cpu", "sky") if rep % 2 == 0 else ("sky", "cpu")
            got = {}
            for which in order:
                if which == "cpu":
                    got[which] = steps_per_s(cpu_model, cpu_opt, x, y, steps)
                else:
                    got[which] = steps_per_s(sky_model, sky_opt, sx, sy, steps)
            pairs.append(got)
        result["mnist"] = pairs
        result["steps"] = steps
    result["copy"] = copy_rates(quick)
    result["load_end"] = os.getloadavg()
    return result


def section(r: dict, quick: bool) -> str:
    sky_op, cpu_op = r["sky_op"], r["cpu_op"]
    pairs = r["mnist"]
    ratio = statistics.median(p["sky"] / p["cpu"] for p in pairs)
    cpu_rate = statistics.median(p["cpu"] for p in pairs)
    sky_rate = statistics.median(p["sky"] for p in pairs)
    op_verdict = "PASS" if sky_op["p50_us"] <= TARGET_OP_US else "MISS"
    step_verdict = "PASS" if ratio >= TARGET_STEPS else "MISS"
    copy = r["copy"]
    copy_verdict = "PASS" if copy["sky"] / copy["raw"] >= TARGET_COPY else "MISS"
    ls, le = r["load_start"], r["load_end"]
    return "\n".join([
        "## Remote device: the client's cost, training against the CPU, node-to-node copies",
        "",
        f"*Generated by `python bench/remote_device.py{' --quick' if quick else ''}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; load average {ls[0]:.2f} at the start, {le[0]:.2f} at the end. "
        "Re-running it rewrites this section only.*",
        "",
        "A Local `Compute` (its worker is a second process on this machine). **Client cost per queued op**: "
        "`c = a + b` on 16-element tensors, each call timed on its own; ops/s over the whole loop, sends "
        "included. The CPU row is the same line on CPU tensors, for scale. **MNIST**: the network of the MNIST guide (`guides/remote_mnist.py`), "
        "AdamW, batch 256 already on the device; blocks of "
        f"{r['steps']} steps on the client's CPU and on `sky`, interleaved, {len(pairs)} pairs, after 10 warm-up "
        "steps each; the ratio is the median of per-pair ratios. The worker and the client share the "
        "machine's CPUs.",
        "",
        "| per op | p50 µs | p90 µs | ops/s |",
        "| --- | --- | --- | --- |",
        f"| `sky` (queued) | {sky_op['p50_us']:.1f} | {sky_op['p90_us']:.1f} | {sky_op['ops_per_s']:,.0f} |",
        f"| CPU (run) | {cpu_op['p50_us']:.1f} | {cpu_op['p90_us']:.1f} | {cpu_op['ops_per_s']:,.0f} |",
        "",
        "| MNIST, batch 256 | steps/s |",
        "| --- | --- |",
        f"| client CPU | {cpu_rate:.2f} |",
        f"| `sky` on a Local node | {sky_rate:.2f} |",
        "",
        f"**Target: client cost per queued op ≤ {TARGET_OP_US:g} µs (p50).** Measured {sky_op['p50_us']:.1f} µs: "
        f"**{op_verdict}**.",
        "",
        f"**Target: MNIST steps/s on `sky` ≥ {TARGET_STEPS}× the CPU's.** Measured {ratio:.2f}×: **{step_verdict}**.",
        "",
        f"**Node-to-node copy**, {COPY_BYTES >> 20} MiB between two Local computes of a `Cluster`, medians of "
        f"{copy['reps']} interleaved repetitions (GB/s of the copy, from the client's side):",
        "",
        "| path | GB/s | vs raw socket |",
        "| --- | --- | --- |",
        f"| raw TCP socket between the two workers | {copy['raw']:.2f} | 1.00× |",
        f"| `b = a.to(other)`, worker to worker | {copy['sky']:.2f} | {copy['sky'] / copy['raw']:.2f}× |",
        f"| through the client (`a.cpu().to(other)`) | {copy['client']:.2f} | {copy['client'] / copy['raw']:.2f}× |",
        "",
        f"**Target: a node-to-node copy ≥ {TARGET_COPY}× a raw socket's rate.** Measured "
        f"{copy['sky'] / copy['raw']:.2f}×: **{copy_verdict}**.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    r = measure(args.quick)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "remote_device.json"), "w") as f:
        json.dump(r, f, indent=1)
    text = section(r, args.quick)
    print(text)
    if not args.quick:
        write_section(OWNER, text)


if __name__ == "__main__":
    main()
