"""The worker's end of a ``sky`` device: a table of real tensors and the operations on them.

Each client device (one index ``sky:N``) has a :class:`Session` in the worker that serves it.
The client sends its operations in batches, as ordinary tasks of the pool
(:func:`run`); a batch runs in order, and batches run in the order they were sent (each carries
a sequence number, so this holds whatever the pool's task slots). A failing operation raises
:class:`~skyward.errors.DeviceError` naming it; the client raises that at its next sync point.

Runs on the worker: nothing here imports the client's backend.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import torch
from torch.utils import _pytree as pytree

from skyward.errors import DeviceError
from skyward.torch import _kernels as kernels
from skyward.torch import _peer
from skyward.torch._wire import OP_DEFINE, OP_FREE, OP_RECV, OP_RNG, OP_SEED, OP_SEND, Blob, DeviceRef, Described, Expect, Ref

_sessions: dict[str, Session] = {}
_sessions_lock = threading.Lock()


def available_devices() -> list[str]:
    """The devices this machine has, as ``torch.device`` strings."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def _resolve_kind(kind: str) -> torch.device:
    have = available_devices()
    try:
        want = torch.device(kind)
    except RuntimeError:
        want = None
    if want is not None:
        if want.type == "cpu":
            return torch.device("cpu")
        if want.type == "cuda" and want.index is None and "cuda:0" in have:
            return torch.device("cuda", torch.cuda.current_device())
        if str(want) in have:
            return want
    raise DeviceError(
        f"this node has no {kind!r} device; it has: {', '.join(have)}",
        op="open", device=kind,
    )


class _Job:
    """One batch, and the answer its sender waits for (when it asked for one)."""

    __slots__ = ("done", "error", "ops", "request", "value")

    def __init__(self, ops: Any, request: tuple[Any, ...] | None):
        self.ops = ops
        self.request = request
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


#: Batches a device may have waiting before a sender waits for room (bounds the worker's memory
#: when the client queues faster than the device runs).
MAX_WAITING = 64


class Session:
    """One client device's tensors on this worker, and the thread that runs its operations.

    Every operation of the device runs on that one thread, in the order the client sent them
    (batches carry sequence numbers): the same thread each time, as a training loop's ops run
    on one thread locally (a new calling thread costs OpenMP and oneDNN their warm state).
    """

    def __init__(self, index: int, device: torch.device):
        self.index = index
        self.device = device
        self.tensors: dict[int, torch.Tensor] = {}
        self._waiting: dict[int, _Job] = {}
        self._next = 0
        self._cond = threading.Condition()
        self._closed = False
        #: ``(id, size, stride, offset)`` of outputs that differ from what the client assumed,
        #: reported with the next answer.
        self.corrections: list[tuple[Any, ...]] = []
        #: The first failure since the last answer: later operations are skipped (their inputs
        #: may be missing) until a sync point reports it.
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"skyward-sky{index}", daemon=True)
        self._thread.start()

    def put(self, seq: int, job: _Job) -> None:
        with self._cond:
            while len(self._waiting) >= MAX_WAITING and seq != self._next and not self._closed:
                self._cond.wait()
            if self._closed:
                raise DeviceError("this device was closed", op="", device=str(self.device))
            self._waiting[seq] = job
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self.tensors.clear()

    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.set_grad_enabled(False)  # (autograd runs on the client: these are its kernels)
        while True:
            with self._cond:
                while self._next not in self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for job in self._waiting.values():
                        job.error = DeviceError("this device was closed", op="", device=str(self.device))
                        job.done.set()
                    return
                job = self._waiting.pop(self._next)
                self._next += 1
                self._cond.notify_all()
            self._serve(job)

    def _serve(self, job: _Job) -> None:
        try:
            if job.ops:
                if self._failure is None:
                    self.run_ops(job.ops)
                else:
                    self.free_only(job.ops)
        except BaseException as exc:
            self._failure = exc
        if job.request is None:
            return
        try:
            if self._failure is not None:
                job.error, self._failure = self._failure, None
            else:
                job.value = (self.answer(job.request), self.corrections)
                self.corrections = []
        except BaseException as exc:
            job.error = exc
        finally:
            job.done.set()

    def answer(self, request: tuple[Any, ...]) -> Any:
        kind = request[0]
        if kind == "fetch":
            return self.fetch(request[1])
        if kind == "item":
            return self.scalar(request[1])
        if kind == "noop":
            return None
        if kind == "rng":
            return Blob.of(kernels.rng_state(self.device), copy=True)
        if kind == "memory":
            return self.memory()
        if kind == "probe":
            try:
                _peer.current().connect(request[1], request[2])
            except _peer.PeerError as exc:
                return str(exc)
            return None
        return self.describe(request[1], request[2])

    def free_only(self, ops: Any) -> None:
        for name, args, _, _ in ops:
            if name == OP_FREE:
                for tid in args:
                    self.tensors.pop(tid, None)

    # -- decoding ----------------------------------------------------------------------------
    def _decode(self, x: Any) -> Any:
        t = type(x)
        if t is Ref:
            try:
                return self.tensors[x]
            except KeyError:
                raise DeviceError(
                    "an input of this operation is missing: the operation that made it failed "
                    "earlier, or it was freed", op="", device=str(self.device),
                ) from None
        if t is tuple or t is list:
            return t(self._decode(v) for v in x)
        if t is DeviceRef:
            if x != self.index:
                raise DeviceError(f"a tensor on sky:{int(x)} cannot be used on sky:{self.index}",
                                  op="", device=str(self.device))
            return self.device
        if t is Blob:
            return x.tensor().to(self.device, non_blocking=False)
        if t is dict:
            return {k: self._decode(v) for k, v in x.items()}
        return x

    # -- running -------------------------------------------------------------------------------
    def run_ops(self, ops: list[tuple[Any, ...]]) -> None:
        for name, args, kwargs, outs in ops:
            if name == OP_FREE:
                pop = self.tensors.pop
                for tid in args:
                    pop(tid, None)
                continue
            if name == OP_SEED:
                kernels.seed(self.device, args[0])
                continue
            if name == OP_DEFINE:
                kernels.define(*args)
                continue
            if name == OP_RNG:
                kernels.set_rng_state(self.device, args[0].tensor())
                continue
            if name == OP_SEND or name == OP_RECV:
                self._transfer(name, args)
                continue
            try:
                fn = kernels.op(name)
                result = fn(*self._decode(args), **self._decode(kwargs))
            except DeviceError as exc:
                raise DeviceError(f"{name} failed: {exc.args[0]}", op=name, device=str(self.device)) from None
            except Exception as exc:
                raise DeviceError(f"{name} failed: {type(exc).__name__}: {exc}", op=name,
                                  device=str(self.device)) from exc
            if outs:
                if len(outs) == 1 and isinstance(result, torch.Tensor):
                    if outs[0] is not None:
                        self.tensors[outs[0]] = result
                    leaves = [result]
                else:
                    leaves = [v for v in pytree.tree_leaves(result) if isinstance(v, torch.Tensor)]
                    for tid, value in zip(outs, leaves, strict=True):
                        if tid is not None:
                            self.tensors[tid] = value
                if type(outs) is Expect:
                    self._check(outs, leaves)

    def _check(self, outs: Expect, leaves: list[torch.Tensor]) -> None:
        """Note each output whose metadata is not what the client assumed (its meta kernel's)."""
        for tid, want, value in zip(outs, outs.meta, leaves, strict=False):
            if tid is None or want is None:
                continue
            got = (tuple(value.shape), tuple(value.stride()), int(value.storage_offset()))
            if got != want:
                self.corrections.append((tid, *got))

    def _transfer(self, name: str, args: tuple[Any, ...]) -> None:
        try:
            if name == OP_SEND:
                src, xid, address, port = args
                _peer.current().send(address, port, xid, self.tensors[src])
                return
            dst, xid, sender, shape, dtype, new = args
            data = _peer.current().take(xid, sender).view(dtype).reshape(shape)
            if new:
                self.tensors[dst] = data.to(self.device)
            else:
                self.tensors[dst].copy_(data)
        except KeyError:
            raise DeviceError(f"{name} failed: a tensor of the copy is missing (the operation that made it "
                              "failed earlier)", op=name, device=str(self.device)) from None
        except _peer.PeerError as exc:
            raise DeviceError(f"{name} failed: {exc}", op=name, device=str(self.device)) from exc
        except Exception as exc:
            raise DeviceError(f"{name} failed: {type(exc).__name__}: {exc}", op=name,
                              device=str(self.device)) from exc

    def describe(self, op: tuple[Any, ...], first_tid: int) -> Any:
        """Run one operation whose outputs the client could not infer; return them described."""
        name, args, kwargs, _ = op
        try:
            fn = kernels.op(name)
            result = fn(*self._decode(args), **self._decode(kwargs))
        except DeviceError:
            raise
        except Exception as exc:
            # (raised at once, to the caller of the operation: in the device's own words and
            # type, as the same call on this device raises it, with the operation named)
            raise kernels.reworded(exc, f"{exc} [{name} on sky:{self.index}]") from exc
        tid = first_tid

        def describe_leaf(v: Any) -> Any:
            nonlocal tid
            if not isinstance(v, torch.Tensor):
                return v
            self.tensors[tid] = v
            d = Described(tid, tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype)
            tid += 1
            return d

        return pytree.tree_map(describe_leaf, result)

    def memory(self) -> dict[str, int]:
        """What this device holds: ``allocated`` (bytes of this session's tensors' storages, each
        counted once), and on a GPU the allocator's own figures (``torch.cuda.memory_stats``)."""
        seen: dict[int, int] = {}
        for t in self.tensors.values():
            try:
                storage = t.untyped_storage()
            except (NotImplementedError, RuntimeError):  # (sparse and other storage-less layouts)
                continue
            seen[storage.data_ptr()] = storage.nbytes()
        stats = {"session.allocated": sum(seen.values())}
        if self.device.type == "cuda":
            stats.update(torch.cuda.memory_stats(self.device))
        return stats

    def fetch(self, tid: int) -> Any:
        value = self.tensors.get(tid)
        if value is None:
            raise DeviceError("the tensor asked for is missing: the operation that made it failed",
                              op="fetch", device=str(self.device))
        return Blob.of(value.detach().cpu(), copy=False)

    def scalar(self, tid: int) -> Any:
        value = self.tensors.get(tid)
        if value is None:
            raise DeviceError("the tensor asked for is missing: the operation that made it failed",
                              op="item", device=str(self.device))
        return value.item()


def open_session(key: str, index: int, kind: str, address: str, secret: bytes) -> dict[str, Any]:
    """Start serving device ``sky:index`` here on the device ``kind`` names. ``address`` is where
    the pool's other nodes reach this one: node-to-node copies are accepted there only, from
    peers that hold ``secret``."""
    device = _resolve_kind(kind)
    ex = _peer.exchange(address, secret)
    with _sessions_lock:
        _sessions[key] = Session(index, device)
    return {"device": str(device), "devices": available_devices(), "torch": torch.__version__,
            "peer": _peer.peer_info(ex)}


def close_session(key: str) -> None:
    with _sessions_lock:
        session = _sessions.pop(key, None)
    if session is not None:
        session.close()


def _session(key: str) -> Session:
    try:
        return _sessions[key]
    except KeyError:
        raise DeviceError("this device is not open on the node (its worker was restarted?)",
                          op="", device=key) from None


def run(key: str, seq: int, blob: bytes, request: tuple[Any, ...] | None, *buffers: Any) -> Any:
    """Queue one batch (the ``seq``-th of its device) for the device's thread; if it carries a
    ``request``, wait for the answer: ``("fetch", tid)`` (the tensor's bytes), ``("item", tid)``
    (its Python scalar), ``("describe", op, first_tid)`` (run ``op``, describe its outputs),
    ``("rng",)`` (the device's generator state), ``("memory",)`` (what it holds) or
    ``("noop",)``. A failure of an earlier batch is raised here, by the first request after it."""
    session = _session(key)
    job = _Job(pickle.loads(blob, buffers=buffers) if blob else (), request)
    session.put(seq, job)
    if request is None:
        return None
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.value
