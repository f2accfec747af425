"""Round trip of a no-op task on a warm 1-node Local pool: median and p99 over many calls.

    python bench/roundtrip_local.py [--calls 2000]

Also prints the raw pipe floor measured in the same run (two processes ping-ponging a small
pickled tuple), so the figure can be read as a ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import statistics
import time

import skyward as sky


@sky.compute
def noop() -> None:
    return None


def _echo(conn) -> None:  # type: ignore[no-untyped-def]
    while True:
        msg = conn.recv_bytes()
        if msg == b"stop":
            return
        conn.send_bytes(msg)


def pipe_floor(calls: int) -> list[float]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_echo, args=(child,))
    proc.start()
    payload = pickle.dumps(("task", 1, None))
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        parent.send_bytes(payload)
        pickle.loads(parent.recv_bytes())
        samples.append(time.perf_counter() - t)
    parent.send_bytes(b"stop")
    proc.join()
    return samples


def skyward_roundtrip(calls: int) -> list[float]:
    samples = []
    with sky.ComputePool(nodes=1, console=False) as pool:
        for _ in range(200):  # warm up
            noop() >> pool
        for _ in range(calls):
            t = time.perf_counter()
            noop() >> pool
            samples.append(time.perf_counter() - t)
    return samples


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    floor = summary(pipe_floor(args.calls))
    ours = summary(skyward_roundtrip(args.calls))
    print(f"pipe floor      p50 {floor[0] * 1e6:8.1f} us   p99 {floor[1] * 1e6:8.1f} us")
    print(f"skyward >> pool p50 {ours[0] * 1e6:8.1f} us   p99 {ours[1] * 1e6:8.1f} us")
    print(f"ratio (p50)     {ours[0] / floor[0]:.2f}x the pipe floor")


if __name__ == "__main__":
    main()
