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
from skyward.torch._wire import OP_FREE, OP_SEED, Blob, DeviceRef, Described, Ref

_sessions: dict[str, Session] = {}
_sessions_lock = threading.Lock()
_ops: dict[str, Any] = {}


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


class Session:
    """One client device's tensors on this worker, and the order its batches run in."""

    def __init__(self, index: int, device: torch.device):
        self.index = index
        self.device = device
        self.tensors: dict[int, torch.Tensor] = {}
        self.next_seq = 0
        self.turn = threading.Condition()

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
                _seed(self.device, args[0])
                continue
            try:
                fn = _ops.get(name) or _op(name)
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
                else:
                    leaves = [v for v in pytree.tree_leaves(result) if isinstance(v, torch.Tensor)]
                    for tid, value in zip(outs, leaves, strict=True):
                        if tid is not None:
                            self.tensors[tid] = value

    def describe(self, op: tuple[Any, ...], first_tid: int) -> Any:
        """Run one operation whose outputs the client could not infer; return them described."""
        name, args, kwargs, _ = op
        try:
            fn = _ops.get(name) or _op(name)
            result = fn(*self._decode(args), **self._decode(kwargs))
        except Exception as exc:
            raise DeviceError(f"{name} failed: {type(exc).__name__}: {exc}", op=name,
                              device=str(self.device)) from exc
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


def _op(name: str) -> Any:
    """``torch.ops.aten.add.Tensor`` from ``"aten.add.Tensor"`` (cached)."""
    namespace, packet, overload = name.split(".")
    fn = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    _ops[name] = fn
    return fn


def _seed(device: torch.device, seed: int) -> None:
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def open_session(key: str, index: int, kind: str) -> dict[str, Any]:
    """Start serving device ``sky:index`` here on the device ``kind`` names."""
    device = _resolve_kind(kind)
    with _sessions_lock:
        _sessions[key] = Session(index, device)
    return {"device": str(device), "devices": available_devices(), "torch": torch.__version__}


def close_session(key: str) -> None:
    with _sessions_lock:
        _sessions.pop(key, None)


def _session(key: str) -> Session:
    try:
        return _sessions[key]
    except KeyError:
        raise DeviceError("this device is not open on the node (its worker was restarted?)",
                          op="", device=key) from None


def run(key: str, seq: int, blob: bytes, request: tuple[Any, ...] | None, *buffers: Any) -> Any:
    """Run one batch (the ``seq``-th of its device), then answer ``request`` if there is one:
    ``("fetch", tid)`` (the tensor's bytes), ``("item", tid)`` (its Python scalar) or
    ``("describe", op, first_tid)`` (run ``op`` and describe its outputs)."""
    session = _session(key)
    ops = pickle.loads(blob, buffers=buffers) if blob else ()
    with session.turn:
        while session.next_seq != seq:
            session.turn.wait()
        try:
            if ops:
                session.run_ops(ops)
            if request is None:
                return None
            kind = request[0]
            if kind == "fetch":
                return session.fetch(request[1])
            if kind == "item":
                return session.scalar(request[1])
            if kind == "noop":
                return None
            return session.describe(request[1], request[2])
        finally:
            session.next_seq += 1
            session.turn.notify_all()
