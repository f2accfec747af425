"""One measurement per process: ``python bench/cases.py NAME '{"param": ...}'``.

``run.py`` starts every case in a fresh interpreter (so that one system's threads, caches or
memory high-water mark never leak into another's numbers); the case prints one marked JSON
line with its raw samples. Skyward is used only through its public API (``import skyward as
sky``); the baselines (raw pipe floors, ProcessPoolExecutor, Ray, Dask, torchrun, OpenSSH) are
self-contained here. Only the standard library is imported at module level: Dask's spawned
workers re-import this file.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH_DIR, os.path.dirname(BENCH_DIR)]  # this checkout's skyward, not an installed one
from _common import current_rss, emit_result, parse_result, peak_rss

CASES: dict[str, Callable[..., Any]] = {}


def case(fn: Callable[..., Any]) -> Callable[..., Any]:
    CASES[fn.__name__] = fn
    return fn


# -- task bodies (module level, so that every system can ship them) ---------------------------------


def noop() -> None:
    return None


def ident(x: Any) -> Any:
    return x


def nbytes(a: Any) -> int:
    return int(a.nbytes)


def _sky(fn: Callable[..., Any]) -> Any:
    import skyward as sky

    return sky.compute(fn)


# -- helpers ----------------------------------------------------------------------------------------


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = os.read(fd, n)
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _frame(msg: Any) -> bytes:
    body = pickle.dumps(msg, protocol=5)
    return struct.pack("!I", len(body)) + body


def _read_frame(fd: int) -> Any:
    (n,) = struct.unpack("!I", _read_exact(fd, 4))
    return pickle.loads(_read_exact(fd, n))


def _latencies(fn: Callable[[], Any], calls: int) -> list[float]:
    samples, clock = [], time.perf_counter
    for _ in range(calls):
        t = clock()
        fn()
        samples.append(clock() - t)
    return samples


def _alternating(calls: dict[str, Callable[[], Any]], per_block: int, blocks: int, warmup: int) -> dict:
    """Latencies of every system in ``calls``, in blocks whose order rotates (A B C, B C A, ...)."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    names = list(calls)
    samples: dict[str, list[list[float]]] = {name: [] for name in names}
    for b in range(blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            gc.collect()
            samples[name].append(_latencies(calls[name], per_block))
    return {"blocks": samples}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The module each system needs (imported before a clock starts).
MODULES = {"skyward": "skyward", "ppe": "concurrent.futures", "ray": "ray", "dask": "dask.distributed"}


@contextlib.contextmanager
def _system(name: str, workers: int) -> Iterator[tuple[Callable[[], Any], Callable[[int], list[Any]]]]:
    """A warm pool of ``workers`` single-task workers: (one no-op call, n ident tasks run together)."""
    if name == "skyward":
        import skyward as sky

        f, g = sky.compute(noop), sky.compute(ident)
        with sky.ComputePool(nodes=workers, console=False) as pool:
            yield (lambda: f() >> pool), (lambda n: sky.gather(*[g(i) for i in range(n)]) >> pool)
    elif name == "ppe":  # map() sends one message per task (chunksize=1), like the others
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as ex:
            list(ex.map(ident, range(2 * workers)))  # fork its workers now, before any other threads exist
            yield (lambda: ex.submit(noop).result()), (lambda n: list(ex.map(ident, range(n))))
    elif name == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            f, g = ray.remote(noop), ray.remote(ident)
            yield (lambda: ray.get(f.remote())), (lambda n: ray.get([g.remote(i) for i in range(n)]))
        finally:
            ray.shutdown()
    else:
        import logging

        from dask.distributed import Client, LocalCluster

        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield ((lambda: client.submit(noop, pure=False).result()),
                   (lambda n: client.gather(client.map(ident, range(n), pure=False))))


# -- 1. round trip ----------------------------------------------------------------------------------


#: How long the polled floor polls before it blocks: Skyward's default spin (protocol.spin).
_FLOOR_SPIN = 50e-6


def _polled(fd: int) -> None:
    """Poll ``fd`` without sleeping for up to ``_FLOOR_SPIN`` seconds (then a read may block)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    end = time.perf_counter() + _FLOOR_SPIN
    while not poller.poll(0) and time.perf_counter() < end:
        pass


@contextlib.contextmanager
def _rt_floor(polled: bool = False) -> Iterator[Callable[[], None]]:
    """The raw pipe floor: two processes ping-ponging a small pickled tuple over two os.pipe()s.

    Each direction is one framed write and a blocking read of its header and body; both ends
    pickle and unpickle, as any RPC must. ``polled`` (the fair floor, "floor-polled"): each end
    polls its pipe for up to 50 µs before it blocks, as Skyward's worker and a caller of ``>>``
    do; a blocked reader is woken by the kernel, which on a small VM costs more than the trip,
    so the blocking floor is slower than Skyward itself, and bimodal.
    """
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: answer every message with a "result"
        os.close(w1)
        os.close(r2)
        try:
            while True:
                if polled:
                    _polled(r1)
                msg = _read_frame(r1)
                os.write(w2, _frame(("result", msg[1], None)))
        except EOFError:
            os._exit(0)
    os.close(r1)
    os.close(w2)
    counter = iter(range(1 << 62))

    def call() -> None:
        os.write(w1, _frame(("task", next(counter), None)))
        if polled:
            _polled(r2)
        _read_frame(r2)

    try:
        yield call
    finally:
        os.close(w1)
        os.waitpid(pid, 0)
        os.close(r2)


@case
def rt(systems: list[str], calls: int, blocks: int, warmup: int) -> dict:
    """Round trips of ``systems``, all warm at once, in alternating blocks (entered in order: the
    forking ones must come before Skyward's threads exist)."""
    with contextlib.ExitStack() as stack:
        floors = {"floor": False, "floor-polled": True}
        fns = {s: stack.enter_context(_rt_floor(floors[s]) if s in floors else _system(s, 1)) for s in systems}
        return _alternating({s: fn if s in floors else fn[0] for s, fn in fns.items()}, calls, blocks, warmup)


# -- 2. throughput ----------------------------------------------------------------------------------


def _batches(run: Callable[[int], Any], n: int, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        gc.collect()
        t = time.perf_counter()
        results = run(n)
        dt = time.perf_counter() - t
        assert len(results) == n and results[-1] == n - 1, "wrong results"
        out.append(n / dt)
    return out


@contextlib.contextmanager
def _tp_floor(workers: int = 2) -> Iterator[Callable[[int], list[Any]]]:
    """Pickled tuples round robin through pipes to ``workers`` forked echo processes, pipelined.

    Per worker one thread writes while another reads the replies, both buffered: no scheduling
    and no futures, only the pipe, pickle and Python's own loop.
    """
    chans: list[tuple[int, Any, Any]] = []
    for _ in range(workers):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w1)
            os.close(r2)
            for _, other_w, other_r in chans:  # or an earlier child never sees its end of input
                os.close(other_w.fileno())
                os.close(other_r.fileno())
            rf, wf = os.fdopen(r1, "rb", buffering=1 << 16), os.fdopen(w2, "wb", buffering=1 << 16)
            try:
                while len(head := rf.read(4)) == 4:
                    msg = pickle.loads(rf.read(struct.unpack("!I", head)[0]))
                    wf.write(_frame(("result", msg[1], msg[2])))
                    if msg[3]:  # the last of a batch: flush
                        wf.flush()
            except BrokenPipeError:
                pass
            os._exit(0)
        os.close(r1)
        os.close(w2)
        chans.append((pid, os.fdopen(w1, "wb", buffering=1 << 16), os.fdopen(r2, "rb", buffering=1 << 16)))

    def run(count: int) -> list[Any]:
        results: list[Any] = [None] * count

        def send(w: int) -> None:
            mine = range(w, count, workers)
            for i in mine:
                chans[w][1].write(_frame(("task", i, i, i == mine[-1])))
            chans[w][1].flush()

        def recv(w: int) -> None:
            rf = chans[w][2]
            for _ in range(len(range(w, count, workers))):
                (k,) = struct.unpack("!I", rf.read(4))
                reply = pickle.loads(rf.read(k))
                results[reply[1]] = reply[2]

        threads = [threading.Thread(target=fn, args=(w,)) for w in range(workers) for fn in (send, recv)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    try:
        yield run
    finally:
        for pid, wf, rf in chans:
            wf.close()
            os.waitpid(pid, 0)
            rf.close()


@case
def tp(systems: list[str], n: int, batches: int, warmup_n: int) -> dict:
    """Batches of n tiny tasks on each of ``systems`` in turn (rotating order), all warm."""
    with contextlib.ExitStack() as stack:
        runs = {s: stack.enter_context(_tp_floor()) if s == "floor" else stack.enter_context(_system(s, 2))[1]
                for s in systems}
        for run in runs.values():
            run(warmup_n)
        rates: dict[str, list[float]] = {s: [] for s in systems}
        for b in range(batches):
            for s in systems[b % len(systems):] + systems[:b % len(systems)]:
                rates[s] += _batches(runs[s], n, 1)
    return {"rates": rates}


# -- 3. payload -------------------------------------------------------------------------------------


def _floor_pipe_size() -> int:
    """The pipe capacity the payload floor asks for.

    The floor defines its own (it must not depend on how Skyward sets up its transport): the
    largest an unprivileged process may ask for (/proc/sys/fs/pipe-max-size, 1 MiB by default).
    A bigger pipe moves bulk data faster (1 MiB: ~2.8x the default 64 KiB for 64 MiB here), so
    no pipe setting on Skyward's side can make the floor look slow.
    """
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def _payload_result(times: list[float], size: int, baseline: int) -> dict:
    return {"gbps": [size / t / 1e9 for t in times], "nbytes": size,
            "peak_over_baseline": peak_rss() - baseline}


@case
def pl_floor(mib: int, trips: int) -> dict:
    """The raw pipe floor: the array's bytes to a forked child through a pipe and back.

    The child reads everything into a buffer it allocated once, then writes it back; the parent
    writes everything, then reads the reply into a buffer it allocated once. The store-and-forward
    shape of a task (the worker needs its whole argument before it runs), minus serialization.
    """
    import numpy as np

    size = mib << 20
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    for fd in (w1, w2):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _floor_pipe_size())
    # Buffered files: for a read or write larger than their buffer they loop on the pipe directly.
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        rf, wf = open(r1, "rb"), open(w2, "wb")  # noqa: SIM115
        buf = memoryview(bytearray(size))
        while rf.readinto(buf) == size:
            wf.write(buf)
            wf.flush()
        os._exit(0)
    os.close(r1)
    os.close(w2)
    wf, rf = open(w1, "wb"), open(r2, "rb")  # noqa: SIM115
    baseline = current_rss()
    src = memoryview(np.ones(size // 8, dtype=np.float64)).cast("B")
    back = memoryview(bytearray(size))
    times = []
    for i in range(trips + 1):  # the first trip warms up
        t = time.perf_counter()
        wf.write(src)
        wf.flush()
        assert rf.readinto(back) == size
        if i:
            times.append(time.perf_counter() - t)
    assert back[:8] == src[:8] and back[-8:] == src[-8:]
    wf.close()
    os.waitpid(pid, 0)
    rf.close()
    return _payload_result(times, size, baseline)


@case
def pl_skyward(mib: int, trips: int) -> dict:
    import numpy as np

    import skyward as sky

    size = mib << 20
    echo = _sky(ident)
    with sky.ComputePool(nodes=1, console=False) as pool:
        echo(0) >> pool
        gc.collect()
        baseline = current_rss()
        arr = np.ones(size // 8, dtype=np.float64)
        times = []
        for i in range(trips + 1):  # the first trip warms up
            t = time.perf_counter()
            back = echo(arr) >> pool
            dt = time.perf_counter() - t
            assert back.nbytes == size and back[0] == 1.0 and back[-1] == 1.0
            del back
            if i:
                times.append(dt)
        return _payload_result(times, size, baseline)


# -- 4. pool start ----------------------------------------------------------------------------------


def _start(open_: Callable[[], Any], first: Callable[[Any], Any]) -> dict:
    """Seconds from ``open_()`` (a context manager) to the result of ``first``, and to leave it again."""
    t = time.perf_counter()
    cm = open_()
    first(cm.__enter__())
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    cm.__exit__(None, None, None)
    return {"first": t_first, "stop": time.perf_counter() - t}


@case
def st(system: str, nodes: int) -> dict:
    """Pool start: ``nodes`` workers of ``system`` to its first result. The floor: ``nodes`` bare
    interpreters (``python -c pass``) started in parallel and waited for."""
    if system == "floor":
        return _start(lambda: contextlib.nullcontext([subprocess.Popen([sys.executable, "-c", "pass"])
                                                      for _ in range(nodes)]),
                      lambda procs: [p.wait() for p in procs])
    importlib.import_module(MODULES[system])  # import time is not part of the figure
    return _start(lambda: _system(system, nodes), lambda fns: fns[0]())


# -- 5. distributed training ------------------------------------------------------------------------


@case
def ddp_torchrun(steps: int, windows: int, warmup: int, nodes: int = 1, procs: int = 2) -> dict:
    """``nodes`` torchrun launchers on this machine (``--node_rank`` each), ``procs`` ranks each."""
    port = _free_port()
    cmds = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={procs}",
             f"--node_rank={i}", "--master_addr=127.0.0.1", f"--master_port={port}",
             os.path.join(BENCH_DIR, "ddp_script.py"),
             "--steps", str(steps), "--windows", str(windows), "--warmup", str(warmup)] for i in range(nodes)]
    t = time.perf_counter()
    launched = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    outputs = [p.communicate(timeout=300) for p in launched]
    wall = time.perf_counter() - t
    try:
        result = parse_result(outputs[0][0])  # node 0 holds rank 0
    except ValueError:
        raise RuntimeError(f"torchrun failed ({launched[0].returncode}):\n{outputs[0][1][-3000:]}") from None
    # Rank 0 reported its windows: a crash on the way out (torch has aborted in teardown here)
    # does not invalidate them; run.py notes it.
    return dict(result, exit_code=max(p.returncode for p in launched), wall=wall)


def _ddp_task(steps: int, windows: int, warmup: int) -> dict:
    from ddp_script import train  # the very function torchrun's ranks run

    return train(steps, windows, warmup)


@case
def ddp_skyward(steps: int, windows: int, warmup: int, nodes: int = 2, procs: int = 1) -> dict:
    import skyward as sky

    task = _sky(_ddp_task)
    t = time.perf_counter()
    with sky.ComputePool(nodes=nodes, processes_per_node=procs, plugins=[sky.plugins.torch(backend="gloo")],
                         console=False) as pool:
        results = task(steps, windows, warmup) @ pool
        wall = time.perf_counter() - t
    return dict(next(r for r in results if r["rank"] == 0), wall=wall)


# -- 6. over SSH (test hosts; run.py brings them up and down) ---------------------------------------


def _ssh_pool(hosts: list[dict], wheelhouse: str, image_tag: str, **kw: Any) -> Any:
    """A pool on the test hosts, installing from the wheelhouse (the hosts have no internet)."""
    import skyward as sky

    provider = sky.SSH([h["ip"] for h in hosts], user=hosts[0]["user"], key=hosts[0]["key_path"],
                       known_hosts=hosts[0]["known_hosts_all"], find_links=[wheelhouse], no_index=True,
                       connect_timeout=10, system_site_packages=["numpy"])
    # A new tag is an image the hosts have not built yet.
    return sky.ComputePool(provider=provider, nodes=len(hosts), image=sky.Image(env={"BENCH_IMAGE": image_tag}),
                           console=False, **kw)


@case
def ssh_start(hosts: list[dict], wheelhouse: str, image_tag: str) -> dict:
    """Creating a pool of the SSH test hosts to its first result."""
    task = _sky(noop)
    t = time.perf_counter()
    with _ssh_pool(hosts, wheelhouse, image_tag) as pool:
        task() >> pool
        return {"first": time.perf_counter() - t}


@contextlib.contextmanager
def _ssh_master(host: dict) -> Iterator[list[str]]:
    """An OpenSSH master connection to ``host``; yields the ``ssh`` argv (up to the address) that uses it."""
    ctl = f"/tmp/skyward-bench-ssh-{os.getpid()}"
    base = host["ssh_argv"]  # ["ssh", options..., "user@ip"]
    ssh = base[:-1] + ["-o", "ControlMaster=auto", "-o", f"ControlPath={ctl}", "-o", "ControlPersist=300",
                       base[-1]]
    subprocess.run(ssh + ["--", "true"], check=True, timeout=30, stdin=subprocess.DEVNULL)
    try:
        yield ssh
    finally:
        subprocess.run(ssh[:-1] + ["-O", "exit", ssh[-1]], capture_output=True, timeout=30, check=False)


@case
def ssh_payload(host: dict, wheelhouse: str, image_tag: str, sizes: list[int], trips: int) -> dict:
    """One-way bulk transfer to one test host: Skyward against OpenSSH, on the same link.

    Skyward: ``nbytes(a) >> pool`` (the array out, an int back) on a warm one-host pool. OpenSSH:
    ``ssh host 'cat > /dev/null'`` fed the same bytes over a master connection opened beforehand,
    so neither pays for connecting. Trips alternate. GB/s = array bytes / time.
    """
    import numpy as np

    task = _sky(nbytes)

    def by_openssh(ssh: list[str], a: Any) -> None:
        with subprocess.Popen(ssh + ["--", "cat > /dev/null"], stdin=subprocess.PIPE) as p:
            p.communicate(memoryview(a).cast("B"), timeout=300)
        if p.returncode != 0:
            raise RuntimeError("ssh cat failed")

    out: dict[str, dict[str, list[float]]] = {"skyward": {}, "openssh": {}}
    with _ssh_master(host) as ssh, _ssh_pool([host], wheelhouse, image_tag) as pool:
        for size in sizes:
            arr = np.ones((size << 20) // 8, dtype=np.float64)
            # one trip per block: trips alternate, one warm-up trip each
            times = _alternating({"skyward": lambda a=arr: task(a) >> pool,
                                  "openssh": lambda a=arr: by_openssh(ssh, a)}, 1, trips, 1)["blocks"]
            for name, blocks in times.items():
                out[name][str(size)] = [arr.nbytes / t / 1e9 for (t,) in blocks]
    return {"gbps": out}


@case
def ssh_rt(host: dict, wheelhouse: str, image_tag: str, calls: int, blocks: int, warmup: int) -> dict:
    """Round trip over SSH: a no-op ``>>`` on a warm one-host pool against an ``ssh host cat`` echo.

    The echo: one ``ssh host cat`` session kept open; each call writes a small framed pickle (the
    floor's message) to it and reads the same bytes back. Both warm, in alternating blocks.
    """
    task = _sky(noop)
    with _ssh_master(host) as ssh, _ssh_pool([host], wheelhouse, image_tag) as pool:
        cat = subprocess.Popen(ssh + ["--", "cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert cat.stdin is not None and cat.stdout is not None
        w, r = cat.stdin.fileno(), cat.stdout.fileno()
        counter = iter(range(1 << 62))

        def echo() -> None:
            os.write(w, _frame(("task", next(counter), None)))
            _read_frame(r)

        try:
            return _alternating({"cat": echo, "skyward": lambda: task() >> pool}, calls, blocks, warmup)
        finally:
            cat.stdin.close()
            cat.wait(30)


def main() -> None:
    import json

    params = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    emit_result(CASES[sys.argv[1]](**params))


if __name__ == "__main__":
    main()
