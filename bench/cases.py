"""One measurement per process: ``python bench/cases.py NAME '{"param": ...}'``.

Every case runs in a fresh interpreter started by ``run.py`` (so that one system's background
threads, caches or memory high-water mark never leak into another's numbers) and prints one
marked JSON line with its raw samples. Nothing here is imported at module level beyond the
standard library: Dask's spawned workers re-import this file as ``__mp_main__``.

Profiling: with ``BENCH_PROFILE=pyspy`` (or ``cprofile``) and ``BENCH_PROFILE_DIR=DIR`` in the
environment, the Skyward cases sample their timed region — py-spy on the client and on every
worker process, or cProfile on the client — and leave the profiles in DIR.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import io
import os
import pickle
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import current_rss, emit_result, peak_rss  # noqa: E402

CASES: dict[str, Callable[..., Any]] = {}
PYSPY_RATE = 500  # samples/s per profiled process
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def case(fn: Callable[..., Any]) -> Callable[..., Any]:
    CASES[fn.__name__] = fn
    return fn


# -- the task bodies (module level, so every system can ship them) ---------------------------------


def noop() -> None:
    return None


def ident(i: Any) -> Any:
    return i


def _sky(fn: Callable[..., Any]) -> Any:
    import skyward as sky

    return sky.compute(fn)


# -- helpers -----------------------------------------------------------------------------------------


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = os.read(fd, n)
        if not b:
            raise EOFError
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _readinto_exact(f: io.FileIO, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise EOFError
        got += k


def _write_all(f: io.FileIO, view: memoryview) -> None:
    sent, n = 0, len(view)
    while sent < n:
        sent += f.write(view[sent:])  # type: ignore[operator]


def _latencies(fn: Callable[[], Any], calls: int, warmup: int, collect: bool = True) -> list[float]:
    for _ in range(warmup):
        fn()
    if collect:
        gc.collect()
    samples = []
    clock = time.perf_counter
    for _ in range(calls):
        t = clock()
        fn()
        samples.append(clock() - t)
    return samples


def _counters(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) so far, summed over the threads of process ``pid`` (Linux).

    CPU time comes from ``schedstat`` (nanoseconds, unlike the 10 ms ticks of ``stat``);
    threads that have already exited are not counted.
    """
    cpu, switches = 0, 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                cpu += int(f.read().split()[0])
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:
                        switches += int(line.split()[-1])
        except (OSError, ValueError, IndexError):
            continue
    return cpu / 1e9, switches


def _self_counters() -> tuple[float, int]:
    """(CPU seconds, context switches) of this whole process (every thread), from one syscall."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_init(cpus: int) -> Any:
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return ray


def _dask_cluster(workers: int) -> tuple[Any, Any]:
    import logging

    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.ERROR)
    return cluster, Client(cluster)


@contextlib.contextmanager
def _profiled(pool: Any) -> Iterator[None]:
    """Profile the enclosed region if BENCH_PROFILE is set (see the module docstring)."""
    mode, out = os.environ.get("BENCH_PROFILE"), os.environ.get("BENCH_PROFILE_DIR")
    if not mode or not out:
        yield
        return
    os.makedirs(out, exist_ok=True)
    if mode == "cprofile":
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            yield
        finally:
            prof.disable()
            prof.dump_stats(os.path.join(out, "client.pstats"))
        return
    if mode == "strace":  # system calls per process over the region (counts; strace slows it down)
        workers = pool.worker_pids() if pool is not None else []
        targets = [("client", os.getpid())] + [(f"worker{i}", pid) for i, pid in enumerate(workers)]
        procs = [subprocess.Popen(["strace", "-f", "-c", "-o", os.path.join(out, f"{name}.strace"), "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in targets]
        time.sleep(1.5)
        try:
            yield
        finally:
            time.sleep(0.1)
            for p in procs:
                p.send_signal(signal.SIGINT)
            for p in procs:
                p.wait(30)
        return
    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("BENCH_PROFILE=pyspy needs py-spy (pip install py-spy)")
    workers = pool.worker_pids() if pool is not None else []
    targets = [("client", os.getpid())] + [(f"worker{i}", pid) for i, pid in enumerate(workers)]
    extra = os.environ.get("BENCH_PYSPY_FLAGS", "").split()  # e.g. --gil, --native, --idle
    procs = [
        subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(PYSPY_RATE), "--threads", "--format",
                          "raw", "--output", os.path.join(out, f"{name}.txt")] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, pid in targets
    ]
    time.sleep(1.0)  # let py-spy attach before the region starts
    t = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - t
        with open(os.path.join(out, "region.json"), "w") as f:
            f.write(f'{{"seconds": {seconds}, "rate": {PYSPY_RATE}}}')
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


# -- 1. round trip ---------------------------------------------------------------------------------


def _spin_until_readable(fd: int, seconds: float) -> None:
    """Poll ``fd`` without sleeping for up to ``seconds`` (what Skyward's readers do first)."""
    if seconds <= 0:
        return
    import select

    end = time.perf_counter() + seconds
    p = select.poll()
    p.register(fd, select.POLLIN)
    while not p.poll(0) and time.perf_counter() < end:
        pass


@contextlib.contextmanager
def _rt_floor(spin: float = 0.0) -> Iterator[Callable[[], None]]:
    """Two processes ping-ponging a small pickled tuple over a pair of os.pipe()s.

    Each direction is one framed write and a read of its header and body; both ends pickle and
    unpickle, as any RPC has to. This is the floor a task round trip cannot go below (with
    blocking reads). With ``spin``, both ends first poll for up to that many seconds before
    they block, as Skyward's readers do: the floor of a reader that spins.
    """
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: echo every message back as a "result"
        os.close(w1)
        os.close(r2)
        try:
            while True:
                _spin_until_readable(r1, spin)
                (n,) = struct.unpack("!I", _read_exact(r1, 4))
                msg = pickle.loads(_read_exact(r1, n))
                reply = pickle.dumps(("result", msg[1], None), protocol=5)
                os.write(w2, struct.pack("!I", len(reply)) + reply)
        except EOFError:
            os._exit(0)
    os.close(r1)
    os.close(w2)
    counter = iter(range(1 << 62))

    def call() -> None:
        msg = pickle.dumps(("task", next(counter), None), protocol=5)
        os.write(w1, struct.pack("!I", len(msg)) + msg)
        _spin_until_readable(r2, spin)
        (n,) = struct.unpack("!I", _read_exact(r2, 4))
        pickle.loads(_read_exact(r2, n))

    try:
        yield call, pid
    finally:
        os.close(w1)
        os.waitpid(pid, 0)
        os.close(r2)


@contextlib.contextmanager
def _rt_floor_threads(server_hop: bool = True, client_hop: bool = True) -> Iterator[tuple[Callable[[], None], int]]:
    """The floor again, with (some of) the thread structure of Skyward's round trip.

    ``server_hop``: on the serving side a reader thread hands each message to a second thread
    (through a queue.SimpleQueue) that answers it. ``client_hop``: the caller sends, then waits
    on a concurrent.futures.Future that a reader thread resolves. Same pipes and pickles as the
    floor: what this adds over it is the price of the thread hand-offs (and the GIL between).
    """
    import queue
    from concurrent.futures import Future

    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def reply_to(msg: Any) -> None:
            reply = pickle.dumps(("result", msg[1], None), protocol=5)
            os.write(w2, struct.pack("!I", len(reply)) + reply)

        def answer() -> None:
            while (msg := jobs.get()) is not None:
                reply_to(msg)

        if server_hop:
            threading.Thread(target=answer, daemon=True).start()
        handle = jobs.put if server_hop else reply_to
        try:
            while True:
                (n,) = struct.unpack("!I", _read_exact(r1, 4))
                handle(pickle.loads(_read_exact(r1, n)))
        except EOFError:
            os._exit(0)
    os.close(r1)
    os.close(w2)
    waiting: dict[int, Future[Any]] = {}

    def read_reply() -> Any:
        (n,) = struct.unpack("!I", _read_exact(r2, 4))
        return pickle.loads(_read_exact(r2, n))

    def reader() -> None:
        try:
            while True:
                reply = read_reply()
                waiting.pop(reply[1]).set_result(reply[2])
        except (EOFError, OSError):
            return

    t = threading.Thread(target=reader, daemon=True)
    if client_hop:
        t.start()
    counter = iter(range(1 << 62))

    def call() -> None:
        i = next(counter)
        msg = pickle.dumps(("task", i, None), protocol=5)
        if client_hop:
            fut: Future[Any] = Future()
            waiting[i] = fut
            os.write(w1, struct.pack("!I", len(msg)) + msg)
            fut.result()
        else:
            os.write(w1, struct.pack("!I", len(msg)) + msg)
            read_reply()

    try:
        yield call, pid
    finally:
        os.close(w1)
        os.waitpid(pid, 0)
        if client_hop:
            t.join(5)
        os.close(r2)


@contextlib.contextmanager
def _rt_skyward(spin_us: int | None = None) -> Iterator[Callable[[], None]]:
    """``spin_us``: SKYWARD_SPIN_US for this pool (None: Skyward's default)."""
    import skyward as sky

    task = _sky(noop)
    saved = os.environ.get("SKYWARD_SPIN_US")
    if spin_us is not None:
        os.environ["SKYWARD_SPIN_US"] = str(spin_us)
    try:
        pool = sky.ComputePool(nodes=1, console=False)
    finally:
        if saved is None:
            os.environ.pop("SKYWARD_SPIN_US", None)
        else:
            os.environ["SKYWARD_SPIN_US"] = saved
    with pool:
        yield (lambda: task() >> pool), pool.worker_pids()[0]


@contextlib.contextmanager
def _rt_ppe() -> Iterator[Callable[[], None]]:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1) as ex:
        ex.submit(noop).result()  # fork its worker now, before other systems start threads
        yield (lambda: ex.submit(noop).result()), next(iter(ex._processes))


#: Entered in this order: the forking ones before Skyward's threads exist.
_RT_LOCAL: dict[str, Callable[[], Any]] = {
    "floor": _rt_floor,
    "floor_spin": lambda: _rt_floor(spin=50e-6),
    "floor_server_hop": lambda: _rt_floor_threads(server_hop=True, client_hop=False),
    "floor_client_hop": lambda: _rt_floor_threads(server_hop=False, client_hop=True),
    "floor_both_hops": lambda: _rt_floor_threads(server_hop=True, client_hop=True),
    "ppe": _rt_ppe,
    "skyward": _rt_skyward,
    "skyward_nospin": lambda: _rt_skyward(spin_us=0),
}


@case
def rt_local(systems: list[str], calls: int, blocks: int, warmup: int) -> dict:
    """Round trips of the systems that need no daemons, all warm at once, in alternating blocks.

    Block b measures ``calls`` round trips of each system in turn (the order rotates every
    block), so that every system sees the same moments of a noisy machine: A B C A B C ...
    """
    with contextlib.ExitStack() as stack:
        entered = {name: stack.enter_context(make()) for name, make in _RT_LOCAL.items() if name in systems}
        for call, _ in entered.values():
            for _ in range(warmup):
                call()
        samples: dict[str, list[list[float]]] = {name: [] for name in systems}
        # per round trip: CPU seconds and context switches of the client and of the serving process
        cost = {name: [0.0, 0, 0.0, 0] for name in systems}
        for b in range(blocks):
            order = systems[b % len(systems):] + systems[:b % len(systems)]
            for name in order:
                call, server = entered[name]
                gc.collect()
                s0 = _counters(server)
                c0 = _self_counters()  # the client's window holds nothing but the round trips
                samples[name].append(_latencies(call, calls, 0, collect=False))
                c1 = _self_counters()
                s1 = _counters(server)
                acc = cost[name]
                acc[0] += c1[0] - c0[0]
                acc[1] += c1[1] - c0[1]
                acc[2] += s1[0] - s0[0]
                acc[3] += s1[1] - s0[1]
    total = calls * blocks
    per_call = {name: {"client_cpu_us": c[0] / total * 1e6, "client_switches": c[1] / total,
                       "server_cpu_us": c[2] / total * 1e6, "server_switches": c[3] / total}
                for name, c in cost.items()}
    return {"blocks": samples, "per_call": per_call}


@case
def rt_profile(calls: int, warmup: int) -> dict:
    """Skyward's round trip alone, for a profiler (see _profiled)."""
    import skyward as sky

    task = _sky(noop)
    with sky.ComputePool(nodes=1, console=False) as pool:
        for _ in range(warmup):
            task() >> pool
        with _profiled(pool):
            samples = _latencies(lambda: task() >> pool, calls, 0)
    return {"samples": samples}


@case
def rt_ray(calls: int, warmup: int) -> dict:
    ray = _ray_init(1)
    try:
        f = ray.remote(noop)
        samples = _latencies(lambda: ray.get(f.remote()), calls, warmup)
    finally:
        ray.shutdown()
    return {"samples": samples}


@case
def rt_dask(calls: int, warmup: int) -> dict:
    cluster, client = _dask_cluster(1)
    try:
        samples = _latencies(lambda: client.submit(noop, pure=False).result(), calls, warmup)
    finally:
        client.close()
        cluster.close()
    return {"samples": samples}


@case
def rt_costs(n: int, repeats: int) -> dict:
    """What one no-op round trip costs, stage by stage, timed in one thread (µs per call).

    A cost model for the "What bounds it" section: each of Skyward's per-task steps on the
    client and on the worker, timed in isolation with in-memory streams (no pipe, no other
    thread), next to the pieces of the floor and the price of one thread hand-off. Uses
    Skyward's internals; a stage whose internals changed is reported as missing, not guessed.
    """
    import inspect
    import queue
    from concurrent.futures import Future

    import skyward as sky
    from skyward import protocol

    task = _sky(noop)
    p = task()
    results: dict[str, float | None] = {}

    def timed(label: str, fn: Callable[[], Any], count: int = n) -> None:
        try:
            fn()
            runs = []
            for _ in range(repeats):
                t = time.perf_counter()
                for _ in range(count):
                    fn()
                runs.append((time.perf_counter() - t) / count * 1e6)
            runs.sort()
            results[label] = runs[len(runs) // 2]
        except Exception as exc:  # internals moved: say so
            results[label] = None
            results[label + " (error)"] = f"{type(exc).__name__}: {exc}"  # type: ignore[assignment]

    class Sink(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            return memoryview(b).nbytes

    writer = protocol.FrameWriter(io.BufferedWriter(Sink()))
    payload = p.payload()
    task_frame = io.BytesIO()
    protocol.FrameWriter(task_frame).send((protocol.Kind.TASK, 1, "noop"), payload)
    task_bytes = task_frame.getvalue()
    result_frame = io.BytesIO()
    protocol.FrameWriter(result_frame).send((protocol.Kind.RESULT, 1), protocol.dumps_payload(None))
    result_bytes = result_frame.getvalue()
    blob = payload.data

    # floor pieces
    timed("floor: pickle.dumps + loads of a small tuple", lambda: pickle.loads(pickle.dumps(("task", 1, None))))
    # client, per task
    timed("client: noop() builds a PendingCompute", task)
    timed("client: PendingCompute.payload() (cloudpickle)", p.payload)
    timed("  same tuple with stdlib pickle.dumps, for comparison",
          lambda: pickle.dumps((b"x" * 10, (), {}), protocol=5))
    timed("client: FrameWriter.send of the TASK frame (in memory)",
          lambda: writer.send((protocol.Kind.TASK, 1, "noop"), payload))
    timed("client: FrameReader.recv of the RESULT frame (in memory)",
          lambda: protocol.FrameReader(io.BytesIO(result_bytes)).recv())
    none_pickle = protocol.dumps_payload(None).data
    timed("client: loads_payload of the result", lambda: protocol.loads_payload([none_pickle]))
    timed("client: Future() + set_result + result (one thread)",
          lambda: (lambda f: (f.set_running_or_notify_cancel(), f.set_result(None), f.result()))(Future()))
    try:
        from skyward import events as ev

        timed("client: one event object (TaskStarted)", lambda: ev.TaskStarted(1, 0, "noop"))
    except Exception:
        pass
    # worker, per task
    timed("worker: FrameReader.recv of the TASK frame (in memory)",
          lambda: protocol.FrameReader(io.BytesIO(task_bytes)).recv())
    try:
        try:
            from skyward.worker.executors import base as slots
        except ImportError:  # before the executors were split from the agent
            from skyward.worker import slots  # type: ignore[no-redef]

        sent: list[Any] = []
        params = list(inspect.signature(slots.run_task).parameters)
        parts = [blob]
        if "name" in params:
            def run_one() -> None:
                slots.run_task((), 1, "noop", parts, lambda c, pl: sent.append(c), lambda *a: None)
        else:
            def run_one() -> None:
                slots.run_task((), 1, parts, lambda c, pl: sent.append(c), lambda *a: None)
        timed("worker: run_task (unpickle, call, pickle result; no I/O)", run_one)
        sent.clear()
    except Exception as exc:
        results["worker: run_task (error)"] = f"{type(exc).__name__}: {exc}"  # type: ignore[assignment]

    # thread hand-offs
    def pingpong(count: int) -> float:
        a: queue.SimpleQueue[Any] = queue.SimpleQueue()
        b: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def other() -> None:
            while (x := a.get()) is not None:
                b.put(x)

        t = threading.Thread(target=other)
        t.start()
        t0 = time.perf_counter()
        for i in range(count):
            a.put(i)
            b.get()
        dt = time.perf_counter() - t0
        a.put(None)
        t.join()
        return dt / count / 2 * 1e6

    hops = sorted(pingpong(n) for _ in range(repeats))
    results["one thread hand-off (SimpleQueue ping-pong / 2)"] = hops[len(hops) // 2]
    return {"costs": results, "n": n, "repeats": repeats, "skyward": sky.__version__ if hasattr(sky, "__version__")
            else None}


# -- 2. throughput ---------------------------------------------------------------------------------


def _batches(run: Callable[[int], Any], n: int, batches: int, warmup_n: int) -> list[float]:
    if warmup_n:
        run(warmup_n)
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
    """Pickled tuples through pipes to ``workers`` forked echo processes, pipelined.

    Messages go round robin; per worker, a thread writes while another reads the replies.
    No scheduling and no futures: what is left is the pipe, pickle and Python's own loop cost.
    """
    chans = []
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
                while True:
                    head = rf.read(4)
                    if len(head) < 4:
                        os._exit(0)
                    (k,) = struct.unpack("!I", head)
                    msg = pickle.loads(rf.read(k))
                    reply = pickle.dumps(("result", msg[1], msg[2]), protocol=5)
                    wf.write(struct.pack("!I", len(reply)) + reply)
                    if msg[3]:  # last of a batch: flush
                        wf.flush()
            except (EOFError, BrokenPipeError):
                os._exit(0)
        os.close(r1)
        os.close(w2)
        chans.append((pid, os.fdopen(w1, "wb", buffering=1 << 16), os.fdopen(r2, "rb", buffering=1 << 16)))

    def run(count: int) -> list[Any]:
        results: list[Any] = [None] * count

        def send(w: int) -> None:
            wf = chans[w][1]
            mine = range(w, count, workers)
            last = mine[-1] if len(mine) else -1
            for i in mine:
                msg = pickle.dumps(("task", i, i, i == last), protocol=5)
                wf.write(struct.pack("!I", len(msg)) + msg)
            wf.flush()

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


@contextlib.contextmanager
def _tp_ppe() -> Iterator[Callable[[int], list[Any]]]:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as ex:
        list(ex.map(ident, range(4)))  # fork its workers now, before other systems start threads
        yield lambda count: list(ex.map(ident, range(count)))


@contextlib.contextmanager
def _tp_skyward() -> Iterator[Callable[[int], list[Any]]]:
    import skyward as sky

    task = _sky(ident)
    with sky.ComputePool(nodes=2, console=False) as pool:
        yield lambda count: sky.gather(*[task(i) for i in range(count)]) >> pool


_TP_LOCAL = {"floor": _tp_floor, "ppe": _tp_ppe, "skyward": _tp_skyward}


@case
def tp_local(systems: list[str], n: int, batches: int, warmup_n: int) -> dict:
    """Batches of n tiny tasks on each daemon-less system in turn (rotating order), all warm."""
    with contextlib.ExitStack() as stack:
        runs = {name: stack.enter_context(make()) for name, make in _TP_LOCAL.items() if name in systems}
        for run in runs.values():
            run(warmup_n)
        rates: dict[str, list[float]] = {name: [] for name in systems}
        for b in range(batches):
            order = systems[b % len(systems):] + systems[:b % len(systems)]
            for name in order:
                rates[name] += _batches(runs[name], n, 1, 0)
    return {"rates": rates}


@case
def tp_profile(n: int, batches: int, warmup_n: int) -> dict:
    """Skyward's throughput alone, for a profiler (see _profiled)."""
    import skyward as sky

    task = _sky(ident)
    with sky.ComputePool(nodes=2, console=False) as pool:
        def run(count: int) -> list[Any]:
            return sky.gather(*[task(i) for i in range(count)]) >> pool

        run(warmup_n)
        with _profiled(pool):
            rates = _batches(run, n, batches, 0)
    return {"rates": rates}


@case
def tp_ray(n: int, batches: int, warmup_n: int) -> dict:
    ray = _ray_init(2)
    try:
        f = ray.remote(ident)
        rates = _batches(lambda count: ray.get([f.remote(i) for i in range(count)]), n, batches, warmup_n)
    finally:
        ray.shutdown()
    return {"rates": rates}


@case
def tp_dask(n: int, batches: int, warmup_n: int) -> dict:
    cluster, client = _dask_cluster(2)
    try:
        rates = _batches(lambda count: client.gather(client.map(ident, range(count), pure=False)), n, batches,
                         warmup_n)
    finally:
        client.close()
        cluster.close()
    return {"rates": rates}


# -- 3. payload ------------------------------------------------------------------------------------


def _payload_result(times: list[float], nbytes: int, baseline: int) -> dict:
    peak = peak_rss()
    return {"seconds": times, "gbps": [nbytes / t / 1e9 for t in times], "nbytes": nbytes,
            "rss_baseline": baseline, "rss_peak": peak, "peak_over_baseline": peak - baseline}


@case
def pl_floor(mib: int, trips: int) -> dict:
    """The raw pipe floor: the array's bytes to a forked child through a pipe and back.

    The child reads everything into a buffer it allocated once, then writes it back; the
    parent writes everything, then reads the reply into a buffer it allocated once. Same
    store-and-forward shape as a task (the worker needs the whole argument before it runs),
    minus serialization and allocation.
    """
    import numpy as np

    nbytes = mib << 20
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    # The same pipe capacity Skyward's Local transport asks for, so the floor stays a floor.
    from skyward.transport.local import PIPE_SIZE

    for fd in (w1, w2):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        rf, wf = io.FileIO(r1, "r"), io.FileIO(w2, "w")
        buf = memoryview(bytearray(nbytes))
        try:
            while True:
                _readinto_exact(rf, buf)
                _write_all(wf, buf)
        except (EOFError, BrokenPipeError):
            os._exit(0)
    os.close(r1)
    os.close(w2)
    wf, rf = io.FileIO(w1, "w"), io.FileIO(r2, "r")
    baseline = current_rss()
    arr = np.ones(nbytes // 8, dtype=np.float64)
    src = memoryview(arr).cast("B")
    back = memoryview(bytearray(nbytes))
    times = []
    for i in range(trips + 1):  # the first trip warms up
        t = time.perf_counter()
        _write_all(wf, src)
        _readinto_exact(rf, back)
        if i:
            times.append(time.perf_counter() - t)
    assert back[:8] == src[:8] and back[-8:] == src[-8:]
    wf.close()
    os.waitpid(pid, 0)
    rf.close()
    return _payload_result(times, nbytes, baseline)


@case
def pl_skyward(mib: int, trips: int) -> dict:
    import numpy as np

    import skyward as sky

    nbytes = mib << 20
    echo = _sky(ident)
    with sky.ComputePool(nodes=1, console=False) as pool:
        echo(0) >> pool
        gc.collect()
        baseline = current_rss()
        arr = np.ones(nbytes // 8, dtype=np.float64)
        times = []
        with _profiled(pool):
            for i in range(trips + 1):  # the first trip warms up
                t = time.perf_counter()
                back = echo(arr) >> pool
                dt = time.perf_counter() - t
                assert back.nbytes == nbytes and back[0] == 1.0 and back[-1] == 1.0
                del back
                if i:
                    times.append(dt)
        result = _payload_result(times, nbytes, baseline)
    return result


# -- 4. pool start ---------------------------------------------------------------------------------


@case
def st_floor(nodes: int) -> dict:
    """``nodes`` bare Python interpreters (``python -c pass``) started in parallel and waited for."""
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(nodes)]
    for p in procs:
        p.wait()
    first = time.perf_counter() - t
    return {"first": first, "stop": 0.0}


@case
def st_skyward(nodes: int) -> dict:
    import skyward as sky

    task = _sky(noop)
    with _profiled(None):
        t = time.perf_counter()
        pool = sky.ComputePool(nodes=nodes, console=False)
        with pool:
            task() >> pool
            first = time.perf_counter() - t
            t_stop = time.perf_counter()
        stop = time.perf_counter() - t_stop
    return {"first": first, "stop": stop}


@case
def st_ray(nodes: int) -> dict:
    import ray

    t = time.perf_counter()
    _ray_init(nodes)
    ray.get(ray.remote(noop).remote())
    first = time.perf_counter() - t
    t_stop = time.perf_counter()
    ray.shutdown()
    return {"first": first, "stop": time.perf_counter() - t_stop}


@case
def st_dask(nodes: int) -> dict:
    import dask.distributed  # noqa: F401  (import time is not part of the figure)

    t = time.perf_counter()
    cluster, client = _dask_cluster(nodes)
    client.submit(noop, pure=False).result()
    first = time.perf_counter() - t
    t_stop = time.perf_counter()
    client.close()
    cluster.close()
    return {"first": first, "stop": time.perf_counter() - t_stop}


@case
def st_ppe(nodes: int) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    t = time.perf_counter()
    ex = ProcessPoolExecutor(nodes)
    ex.submit(noop).result()
    first = time.perf_counter() - t
    t_stop = time.perf_counter()
    ex.shutdown()
    return {"first": first, "stop": time.perf_counter() - t_stop}


# -- over SSH (test hosts; run.py brings them up and down) -----------------------------------------


def _ssh_provider(hosts: list[dict], wheelhouse: str) -> Any:
    from skyward.providers.ssh import SSH

    return SSH([h["ip"] for h in hosts], user=hosts[0]["user"], key=hosts[0]["key_path"],
               known_hosts=hosts[0]["known_hosts_all"], find_links=[wheelhouse], no_index=True,
               connect_timeout=10, system_site_packages=["numpy"])


@case
def ssh_start(hosts: list[dict], wheelhouse: str, image_tag: str) -> dict:
    """Pool of len(hosts) SSH test hosts: entering the pool to the first result.

    A new ``image_tag`` is a new image, so its environment is built from scratch on every host
    (cold); a tag used before finds the environment there (warm).
    """
    import skyward as sky

    task = _sky(noop)
    events: list[Any] = []
    t = time.perf_counter()
    with sky.ComputePool(provider=_ssh_provider(hosts, wheelhouse), nodes=len(hosts),
                         image=sky.Image(env={"SKYWARD_BENCH_IMAGE": image_tag}), console=False,
                         on_event=events.append) as pool:
        task() >> pool
        first = time.perf_counter() - t
        t_stop = time.perf_counter()
    stop = time.perf_counter() - t_stop
    logs = [getattr(e, "line", "") for e in events if type(e).__name__ == "NodeLog"]
    return {"first": first, "stop": stop, "warm": any("reused" in line for line in logs),
            "log_tail": logs[-6:]}


def _nbytes(a: Any) -> int:
    return int(a.nbytes)


@case
def ssh_payload(host: dict, wheelhouse: str, image_tag: str, sizes: list[int], trips: int) -> dict:
    """One-way bulk transfer to one SSH test host: Skyward vs OpenSSH on the same link.

    Skyward: ``nbytes(a) >> pool`` (the array goes to the worker, a small int comes back) on a
    warm one-host pool. OpenSSH: ``ssh host 'cat > /dev/null'`` fed the array's bytes, over a
    multiplexed master connection opened beforehand (ControlMaster), so neither side pays for
    connecting. Trips alternate between the two. GB/s = array bytes / time.
    """
    import numpy as np

    import skyward as sky

    ctl = f"/tmp/skyward-bench-ssh-{os.getpid()}"
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={ctl}", "-o", "ControlPersist=300"]
    base = host["ssh_argv"]  # ["ssh", options..., "user@ip"]
    ssh = base[:-1] + mux + base[-1:]
    subprocess.run(ssh + ["--", "true"], check=True, timeout=30, stdin=subprocess.DEVNULL)  # opens the master
    task = _sky(_nbytes)
    out: dict[str, dict[str, list[float]]] = {"skyward": {}, "openssh": {}}
    try:
        with sky.ComputePool(provider=_ssh_provider([host], wheelhouse), nodes=1,
                             image=sky.Image(env={"SKYWARD_BENCH_IMAGE": image_tag}), console=False) as pool:
            for size in sizes:
                arr = np.ones((size << 20) // 8, dtype=np.float64)
                view = memoryview(arr).cast("B")
                sky_t: list[float] = []
                ssh_t: list[float] = []

                def by_skyward() -> float:
                    t = time.perf_counter()
                    assert task(arr) >> pool == arr.nbytes
                    return time.perf_counter() - t

                def by_openssh() -> float:
                    t = time.perf_counter()
                    p = subprocess.Popen(ssh + ["--", "cat > /dev/null"], stdin=subprocess.PIPE)
                    assert p.stdin is not None
                    p.stdin.write(view)
                    p.stdin.close()
                    if p.wait(300) != 0:
                        raise RuntimeError("ssh cat failed")
                    return time.perf_counter() - t

                by_skyward()
                by_openssh()  # warm up both
                for i in range(trips):
                    for name in (("skyward", "openssh") if i % 2 == 0 else ("openssh", "skyward")):
                        (sky_t if name == "skyward" else ssh_t).append(by_skyward() if name == "skyward"
                                                                      else by_openssh())
                out["skyward"][str(size)] = [arr.nbytes / t / 1e9 for t in sky_t]
                out["openssh"][str(size)] = [arr.nbytes / t / 1e9 for t in ssh_t]
                del arr, view
    finally:
        subprocess.run(base[:-1] + mux + ["-O", "exit", base[-1]], capture_output=True, timeout=30)
    return {"gbps": out}


# -- 5. distributed training tax ---------------------------------------------------------------------


@case
def ddp_torchrun(steps: int, windows: int, warmup: int) -> dict:
    from _common import parse_result

    script = os.path.join(BENCH_DIR, "ddp_script.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           f"--master_port={_free_port()}", script,
           "--steps", str(steps), "--windows", str(windows), "--warmup", str(warmup)]
    env = dict(os.environ)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    wall = time.perf_counter() - t
    try:
        result = parse_result(done.stdout)
    except ValueError:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}") from None
    # Rank 0 reported its windows; a crash on the way out (torch has aborted in teardown here,
    # "terminate called without an active exception") does not invalidate them, but is noted.
    result["exit_code"] = done.returncode
    result["wall"] = wall
    return result


def _ddp_task(steps: int, windows: int, warmup: int) -> dict:
    from ddp_script import train  # the very same function torchrun's ranks run

    return train(steps, windows, warmup)


@case
def ddp_skyward(steps: int, windows: int, warmup: int) -> dict:
    import skyward as sky

    task = _sky(_ddp_task)
    t = time.perf_counter()
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch(backend="gloo")], console=False) as pool:
        with _profiled(pool):
            results = task(steps, windows, warmup) @ pool
        wall = time.perf_counter() - t
    result = next(r for r in results if r["rank"] == 0)
    result["wall"] = wall
    return result


def main() -> None:
    import json

    name = sys.argv[1]
    params = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    emit_result(CASES[name](**params))


if __name__ == "__main__":
    main()
