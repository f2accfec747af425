"""The client's ``sky`` device: tensors that live on a node, and the operations streamed to it.

A :class:`SkyTensor` is a handle: shape, strides, dtype and an id in its node's table, never the
data. Every aten operation on one reaches :meth:`SkyTensor.__torch_dispatch__`, which

1. works out the outputs' metadata by running the operation on ``meta`` tensors, once per
   signature (operation, input shapes/strides/dtypes, non-float arguments): later calls with
   the same signature reuse the answer;
2. gives each new output a handle and an id, and queues ``(op, arguments, output ids)`` on the
   device (:class:`RemoteDevice`);
3. returns the handles at once. Queued operations go to the node in batches, as tasks of the
   pool; the client waits only where it needs a value (``.item()``, ``.cpu()``, printing...):
   one round trip per sync point.

An operation whose outputs depend on the data (``nonzero``, ``item``) runs at once on the node,
which describes what it made. Handles freed here are freed there, in the next batch.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from skyward.errors import DeviceError
from skyward.torch._wire import INLINE_BYTES, OP_FREE, OP_RECV, OP_SEED, OP_SEND, Blob, DeviceRef, Described, Ref

BACKEND = "sky"
#: A batch goes out when it holds this many operations...
BATCH_OPS = 256
#: ... or this many bytes of client tensors, or when its first operation is this old (seconds).
BATCH_BYTES = 1 << 20
BATCH_AGE = 0.005

_devices: dict[int, RemoteDevice] = {}
_registry_lock = threading.Lock()
#: What a node's worker asks of a peer before it accepts a node-to-node copy from it. Made
#: here, per client process; it reaches the workers over the pool's own channels only.
SECRET = os.urandom(32)
_transfers = itertools.count(1)
#: (sending worker, receiving worker) -> None (direct) or why the sender cannot reach the other.
_routes: dict[tuple[str, str], str | None] = {}

# Operations that always need the node's answer (their result is a value, not a tensor).
_SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.equal.default", "aten.is_nonzero.default"})
# Operations whose float arguments decide the output's shape (keyed by value, not by type).
_FLOAT_SHAPED = frozenset({"arange", "range", "linspace", "logspace", "histc"})
_UNSUPPORTED = {
    "aten._pin_memory.default": "pin_memory()",
    "aten.is_pinned.default": "is_pinned()",
}


class Link:
    """How a device reaches its node's worker: run ``skyward.torch._server.run`` there."""

    node: int

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        raise NotImplementedError

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def lost(self) -> BaseException | None:
        """The error the node was lost with, or None while it runs."""
        raise NotImplementedError


def _server() -> Any:
    from skyward.torch import _server

    return _server


class RemoteDevice:
    """``sky:N``: a node's device, the operations queued for it, and the ids of its tensors."""

    def __init__(self, index: int, link: Link, kind: str, real: str, key: str):
        self.index = index
        self.link = link
        self.kind = kind  # what the user asked for ("cuda")
        self.real = real  # what the node gave ("cuda:0")
        self.key = key  # the session's name on the worker
        self.torch_device = torch.device(BACKEND, index)
        self.closed: str | None = None
        #: Where this device's worker takes node-to-node copies: address, port, worker id.
        self.peer: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._ops: list[tuple[Any, ...]] = []
        self._frees: collections.deque[int] = collections.deque()
        self._bytes = 0
        self._since = 0.0
        self._tid = 0
        self._seq = 0
        self._run = _server().run
        #: Operations sent and batches sent (for benchmarks and tests).
        self.sent_ops = 0
        self.sent_batches = 0

    def __repr__(self) -> str:
        return f"<sky:{self.index} = node {self.link.node}'s {self.real}>"

    # -- handles ---------------------------------------------------------------------------------
    def handle(self, size: Any, stride: Any, offset: int, dtype: torch.dtype) -> SkyTensor:
        self._tid += 1
        return SkyTensor(self, self._tid, size, stride, offset, dtype)

    def free(self, tid: int) -> None:
        if self.closed is None:
            self._frees.append(tid)  # (deque.append: safe from a finalizer on any thread)

    # -- sending -------------------------------------------------------------------------------
    def check_open(self) -> None:
        if self.closed is not None:
            raise DeviceError(f"sky:{self.index} is closed: {self.closed}", op="", device=self.real,
                              node=self.link.node)

    def queue(self, op: tuple[Any, ...], nbytes: int = 0) -> None:
        """Queue one operation (the caller holds the lock); send the batch when it is due."""
        ops = self._ops
        if not ops:
            self._since = time.monotonic()
        ops.append(op)
        self._bytes += nbytes
        if len(ops) >= BATCH_OPS or self._bytes >= BATCH_BYTES or time.monotonic() - self._since > BATCH_AGE:
            self.flush()

    def _batch(self) -> tuple[bytes, list[np.ndarray]]:
        ops = self._ops
        self._ops = []
        self._bytes = 0
        frees = self._frees
        if frees:
            ids = [frees.popleft() for _ in range(len(frees))]
            ops.append((OP_FREE, ids, None, None))
        if not ops:
            return b"", []
        buffers: list[np.ndarray] = []

        def out_of_band(buf: pickle.PickleBuffer) -> bool:
            view = buf.raw()
            if view.nbytes < INLINE_BYTES:
                return True
            buffers.append(np.frombuffer(view, np.uint8))
            return False

        self.sent_ops += len(ops)
        return pickle.dumps(ops, protocol=5, buffer_callback=out_of_band), buffers

    def flush(self) -> None:
        """Send what is queued, without waiting (the caller holds the lock)."""
        blob, buffers = self._batch()
        if not blob:
            return
        seq = self._seq
        self._seq += 1
        self.sent_batches += 1
        # (answered at once: a failure on the node is reported by the next sync point's answer,
        # a lost node by the next sync point's call)
        self.link.submit(self._run, (self.key, seq, blob, None, *buffers))

    def sync(self, request: tuple[Any, ...]) -> Any:
        """Send what is queued with ``request`` and wait for its answer: one round trip."""
        with self._lock:
            self.check_open()
            blob, buffers = self._batch()
            seq = self._seq
            self._seq += 1
            self.sent_batches += 1
            try:
                return self.link.call(self._run, (self.key, seq, blob, request, *buffers))
            except DeviceError as exc:
                if exc.op in (OP_RECV, OP_SEND):  # a copy with another node broke: was it lost?
                    lost = _lost_peer(str(exc))
                    if lost is not None:
                        raise lost from exc
                raise

    def seed(self, seed: int) -> None:
        with self._lock:
            if self.closed is None:
                self.queue((OP_SEED, (seed,), None, None))

    def wait(self) -> None:
        """Wait until every queued operation has run (``torch.sky.synchronize()``)."""
        self.sync(("noop",))


class SkyTensor(torch.Tensor):
    """A tensor on a ``sky`` device: its metadata here, its data on a node."""

    _dev: RemoteDevice
    _tid: int
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, dev: RemoteDevice, tid: int, size: Any, stride: Any, offset: int, dtype: torch.dtype) -> SkyTensor:
        t = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=dev.torch_device
        )
        t._dev = dev
        t._tid = tid
        return t

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __del__(self) -> None:
        dev = self.__dict__.get("_dev")
        if dev is not None:
            dev.free(self._tid)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return _dispatch(func, args, kwargs or {})

    # -- values the client asks for --------------------------------------------------------------
    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(self.detach().cpu())
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def __reduce_ex__(self, proto: Any) -> Any:
        # (torch.save and pickle store the data, as a CPU tensor: a handle means nothing elsewhere)
        return self.detach().cpu().__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        if id(self) in memo:
            return memo[id(self)]
        import copy

        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        for name, value in self.__dict__.items():
            if name not in ("_dev", "_tid"):
                new.__dict__[name] = copy.deepcopy(value, memo)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = new
        return new

    def backward(self, *args: Any, **kwargs: Any) -> None:
        # The autograd engine's per-device threads do not know this device: run on this thread.
        with torch.autograd.set_multithreading_enabled(False):
            super().backward(*args, **kwargs)

    def tolist(self) -> Any:
        return self.detach().cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy: use Tensor.cpu() to copy "
                        "the tensor to host memory first")

    def __format__(self, spec: str) -> str:
        if self.dim() == 0 and not self.requires_grad:
            return self.item().__format__(spec)
        return self.detach().cpu().__format__(spec)

    def data_ptr(self) -> int:
        raise NotImplementedError("data_ptr() is not supported on a sky device: the data lives on a node "
                                  "(copy it with .cpu() first)")

    def untyped_storage(self) -> Any:
        raise NotImplementedError("storage access is not supported on a sky device: the data lives on a node "
                                  "(copy it with .cpu() first)")

    storage = untyped_storage  # type: ignore[assignment]

    def pin_memory(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("pin_memory() is not supported on a sky device (pin the CPU tensor before .to())")


# -- dispatch ---------------------------------------------------------------------------------------

_plans: dict[Any, Any] = {}
_names: dict[Any, str] = {}
_SYNC = object()


def _walk(x: Any, found: list[Any], float_by_value: bool) -> tuple[Any, Any]:
    """(signature, encoded) of one argument; appends each tensor met to ``found``."""
    t = type(x)
    if t is SkyTensor:
        found.append(x)
        return (x.shape, x.stride(), x.storage_offset(), x.dtype), Ref(x._tid)
    if t is float:
        return (float if not float_by_value else x), x
    if t is list or t is tuple:
        sig = []
        enc = []
        for v in x:
            s, e = _walk(v, found, float_by_value)
            sig.append(s)
            enc.append(e)
        return tuple(sig), (enc if t is list else tuple(enc))
    if t is torch.device:
        if x.type == BACKEND:
            found.append(x)
            return ("dev", x.index), DeviceRef(0 if x.index is None else x.index)
        return x, x
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise DeviceError("meta tensors cannot be combined with sky tensors", op="")
        found.append(x)
        return ("cpu", x.shape, x.stride(), x.dtype), x  # (encoded later: see _blobs)
    if t is dict:
        sig = []
        enc = {}
        for k, v in x.items():
            s, e = _walk(v, found, float_by_value)
            sig.append((k, s))
            enc[k] = e
        return tuple(sig), enc
    if isinstance(x, torch.Generator):
        raise NotImplementedError("a custom torch.Generator is not supported on a sky device "
                                  "(seed with torch.manual_seed instead)")
    return x, x


def _device_of(found: list[Any]) -> RemoteDevice:
    dev: RemoteDevice | None = None
    for x in found:
        if type(x) is SkyTensor:
            d = x._dev
        elif type(x) is torch.device:
            d = _device(x.index)
        else:
            continue
        if dev is None:
            dev = d
        elif d is not dev:
            raise DeviceError(f"expected all tensors on one device, found {dev.torch_device} and {d.torch_device} "
                              "(move one with .to())", op="")
    assert dev is not None
    return dev


def _to_meta(x: Any) -> Any:
    if type(x) is SkyTensor:
        size, stride, offset = tuple(x.shape), x.stride(), x.storage_offset()
        need = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
        base = torch.empty(max(need, 0), dtype=x.dtype, device="meta")
        return base.as_strided(size, stride, offset)
    if type(x) is torch.device and x.type == BACKEND:
        return torch.device("meta")
    return x


def _plan(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on meta tensors: what each output is (an input, a new tensor, a value)."""
    meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    try:
        out = func(*meta_args, **meta_kwargs)
    except NotImplementedError:  # data-dependent (nonzero, unique...) or no meta kernel: ask the node
        return _SYNC
    # (any other error is the call's own fault, such as mismatched shapes: raised here, at once,
    # as torch raises it for a local tensor)
    leaves, spec = pytree.tree_flatten(out)
    meta_leaves = [v for v in pytree.tree_leaves((meta_args, meta_kwargs)) if isinstance(v, torch.Tensor)]
    index_of = {id(v): i for i, v in enumerate(meta_leaves)}
    originals = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    plan = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            if id(v) in index_of:
                i = index_of[id(v)]
                was = originals[i]
                now = (tuple(v.shape), v.stride(), v.storage_offset())
                # an out= or in-place op that changed the tensor's shape (resize, t_, squeeze_...)
                changed = now != (tuple(was.shape), was.stride(), was.storage_offset())
                plan.append(("in", i, now if changed else None))
            else:
                plan.append(("new", tuple(v.shape), v.stride(), v.storage_offset(), v.dtype))
        else:
            plan.append(("value", v))
    single = spec.is_leaf() if hasattr(spec, "is_leaf") else False
    return (tuple(plan), spec, single)


def _dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], generic: bool = False) -> Any:
    name = _names.get(func)
    if name is None:
        name = _names[func] = str(func)
    special = None if generic else _SPECIAL.get(name)
    if special is not None:
        return special(func, args, kwargs)
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"{_UNSUPPORTED[name]} is not supported on a sky device")
    found: list[Any] = []
    by_value = func._opname in _FLOAT_SHAPED
    sig_args, enc_args = _walk(args, found, by_value)
    sig_kwargs, enc_kwargs = _walk(kwargs, found, by_value) if kwargs else ((), {})
    dev = _device_of(found)
    key = (func, sig_args, sig_kwargs)
    plan = _plans.get(key)
    if plan is None:
        plan = _SYNC if name in _SYNC_OPS else _plan(func, args, kwargs)
        _plans[key] = plan
    with dev._lock:
        dev.check_open()
        nbytes, big = _blobs(found, enc_args, enc_kwargs)
        if nbytes:
            enc_args, enc_kwargs = _encode_cpu(enc_args), _encode_cpu(enc_kwargs)
        if plan is _SYNC:
            return _run_now(dev, name, enc_args, enc_kwargs)
        steps, spec, single = plan
        outs: list[int | None] = []
        results: list[Any] = []
        tensors = [v for v in found if isinstance(v, torch.Tensor)]
        for step in steps:
            kind = step[0]
            if kind == "new":
                h = dev.handle(step[1], step[2], step[3], step[4])
                outs.append(h._tid)
                results.append(h)
            elif kind == "in":
                outs.append(None)
                t = tensors[step[1]]
                if step[2] is not None:
                    _reshape(t, *step[2])
                results.append(t)
            else:
                results.append(step[1])
        dev.queue((name, enc_args, enc_kwargs, outs), nbytes)
        if big:
            dev.flush()  # (now, while the client tensor is as it was: it was not copied)
    if single:
        return results[0]
    return pytree.tree_unflatten(results, spec)


def _reshape(t: SkyTensor, size: Any, stride: Any, offset: int) -> None:
    """Give handle ``t`` new metadata in place (its node's tensor was resized or restrided)."""
    shell = torch.Tensor._make_wrapper_subclass(  # (no id: its end frees nothing)
        SkyTensor, size, strides=stride, storage_offset=offset, dtype=t.dtype, device=t.device
    )
    t.data = shell


def _blobs(found: list[Any], enc_args: Any, enc_kwargs: Any) -> tuple[int, bool]:
    """Bytes of client tensors among the arguments, and whether any is large."""
    nbytes = 0
    big = False
    for x in found:
        if type(x) is not SkyTensor and isinstance(x, torch.Tensor):
            n = x.numel() * x.element_size()
            nbytes += n + 1  # (+1: an empty tensor is still one to encode)
            big = big or n >= INLINE_BYTES
    return nbytes, big


def _encode_cpu(x: Any) -> Any:
    t = type(x)
    if t is list or t is tuple:
        return t(_encode_cpu(v) for v in x)
    if t is dict:
        return {k: _encode_cpu(v) for k, v in x.items()}
    if t is not SkyTensor and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            x = x.cpu()
        small = x.numel() * x.element_size() < INLINE_BYTES
        return Blob.of(x, copy=small)
    return x


def _run_now(dev: RemoteDevice, name: str, enc_args: Any, enc_kwargs: Any) -> Any:
    first = dev._tid + 1
    result = dev.sync(("describe", (name, enc_args, enc_kwargs, None), first))
    top = dev._tid

    def rebuild(v: Any) -> Any:
        nonlocal top
        if type(v) is Described:
            top = max(top, v.tid)
            return SkyTensor(dev, v.tid, v.size, v.stride, v.offset, v.dtype)
        return v

    out = pytree.tree_map(rebuild, result)
    dev._tid = top
    return out


# -- operations with their own path ----------------------------------------------------------------

def _fetch(t: SkyTensor) -> torch.Tensor:
    """The data of ``t``, here (one round trip)."""
    blob: Blob = t._dev.sync(("fetch", t._tid))
    return blob.tensor()


def _to_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    src = args[0]
    target = kwargs.get("device")
    if target is not None and type(target) is torch.device and target.type != BACKEND:
        local = {k: v for k, v in kwargs.items() if k != "device"}
        if local.get("pin_memory"):
            raise NotImplementedError("pin_memory is not supported on a sky device")
        return func(_fetch(src), device=target, **{k: v for k, v in local.items() if k != "pin_memory"})
    if target is not None and type(src) is SkyTensor and _device(target.index) is not src._dev:
        return _cross_copy(src, _device(target.index), kwargs)
    return _generic(func, args, kwargs)


def _copy_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dst, src = args[0], args[1]
    if type(dst) is not SkyTensor:  # sky -> client
        dst.copy_(_fetch(src), **kwargs)
        return dst
    if type(src) is SkyTensor and src._dev is not dst._dev:
        return _cross_copy(src, dst._dev, {}, into=dst)
    return _generic(func, args, kwargs)


def _route(a: RemoteDevice, b: RemoteDevice) -> str | None:
    """None when ``a``'s worker can send to ``b``'s directly, else why not (asked once a pair)."""
    pair = (a.peer["worker"], b.peer["worker"])
    if pair not in _routes:
        _routes[pair] = a.sync(("probe", b.peer["address"], b.peer["port"]))
    return _routes[pair]


def _cross_copy(src: SkyTensor, dst: RemoteDevice, kwargs: dict[str, Any], into: SkyTensor | None = None) -> Any:
    """``src`` (on one node) to ``dst`` (another node's device): worker to worker when the two
    can reach each other (no byte through the client), else through the client, with a warning.
    ``into``: copy into this tensor of ``dst`` (``copy_``); otherwise a new tensor (``.to``)."""
    a = src._dev
    if into is not None and torch.broadcast_shapes(into.shape, src.shape) != into.shape:
        raise RuntimeError(f"the size of the source {tuple(src.shape)} must match the destination's "
                           f"{tuple(into.shape)} (or broadcast to it)")
    why = _route(a, dst)
    local = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "copy")}
    if why is not None:
        warnings.warn(f"copying {src.device} -> {dst.torch_device} through the client: the nodes cannot "
                      f"reach each other ({why})", stacklevel=4)
        data = _fetch(src)
        if local:
            data = torch.ops.aten._to_copy.default(data, **local)
        if into is not None:
            return into.copy_(data)
        return data.to(dst.torch_device)
    xid = next(_transfers)
    shape, dtype = tuple(src.shape), src.dtype
    with a._lock:
        a.check_open()
        a.queue((OP_SEND, (Ref(src._tid), xid, dst.peer["address"], dst.peer["port"]), None, None))
        a.flush()  # (now: the receiving node waits for these bytes)
    with dst._lock:
        dst.check_open()
        if into is not None:
            dst.queue((OP_RECV, (Ref(into._tid), xid, a.peer["worker"], shape, dtype, False), None, None))
            return into
        h = dst.handle(shape, _contiguous_strides(shape), 0, dtype)
        dst.queue((OP_RECV, (h._tid, xid, a.peer["worker"], shape, dtype, True), None, None))
    if local:
        return torch.ops.aten._to_copy.default(h, **local)
    return h


def _lost_peer(message: str, wait: float = 5.0) -> BaseException | None:
    """The loss of the node a failed copy's ``message`` names (its worker id, or its address and
    port), waiting a little for the pool to notice it."""
    deadline = time.monotonic() + wait
    while True:
        for dev in list(_devices.values()):
            named = dev.peer and (dev.peer["worker"] in message or f"{dev.peer['address']}:{dev.peer['port']}" in message)
            lost = dev.link.lost() if named else None
            if lost is not None:
                return lost
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _generic(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _dispatch(func, args, kwargs, generic=True)


_SPECIAL: dict[str, Callable[..., Any]] = {
    "aten._to_copy.default": _to_copy,
    "aten.copy_.default": _copy_,
    # (asked by ``t.data = other``: a question about the two handles, answered here)
    "aten._has_compatible_shallow_copy_type.default": lambda func, args, kwargs: type(args[0]) is type(args[1]),
}


# -- factories: torch.empty(..., device="sky:N") -------------------------------------------------

def _device(index: int | None) -> RemoteDevice:
    dev = _devices.get(0 if index is None else index)
    if dev is None:
        raise DeviceError(f"sky:{index} is not open: get a device from a Compute (node.device(...)) first",
                          op="", device=f"sky:{index}")
    return dev


def _contiguous_strides(size: Any) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(list(size)):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def _empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> SkyTensor:
    if pin_memory:
        raise NotImplementedError("pin_memory is not supported on a sky device")
    dev = _device(device.index)
    dtype = dtype or torch.get_default_dtype()
    if memory_format is None or memory_format == torch.contiguous_format or memory_format == torch.preserve_format:
        stride = _contiguous_strides(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    with dev._lock:
        dev.check_open()
        h = dev.handle(tuple(size), stride, 0, dtype)
        dev.queue(("aten.empty_strided.default", (tuple(size), stride), {"dtype": dtype, "device": DeviceRef(dev.index)},
                   [h._tid]))
    return h


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> SkyTensor:
    if pin_memory:
        raise NotImplementedError("pin_memory is not supported on a sky device")
    dev = _device(device.index)
    dtype = dtype or torch.get_default_dtype()
    with dev._lock:
        dev.check_open()
        h = dev.handle(tuple(size), tuple(stride), 0, dtype)
        dev.queue(("aten.empty_strided.default", (tuple(size), tuple(stride)),
                   {"dtype": dtype, "device": DeviceRef(dev.index)}, [h._tid]))
    return h


def _copy_from(src: Any, dst: Any, non_blocking: bool = False) -> Any:
    """``aten::_copy_from`` (torch's copy between two backends, as ``torch.tensor(..., device=)``
    makes it): the same as ``dst.copy_(src)``."""
    return _copy_(torch.ops.aten.copy_.default, (dst, src), {})


def _copy_from_and_resize(src: Any, dst: Any) -> Any:
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return _copy_(torch.ops.aten.copy_.default, (dst, src), {})


class _DeviceModule:
    """``torch.sky``: what torch asks of a backend's module (seeding, counts)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return max(_devices, default=-1) + 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        for dev in list(_devices.values()):
            dev.seed(int(seed))

    manual_seed = manual_seed_all

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Wait until every operation queued for ``device`` (all sky devices if None) has run."""
        devs = list(_devices.values()) if device is None else [_device(torch.device(device).index)]
        for dev in devs:
            dev.wait()


_registered = False


def register() -> None:
    """Register the ``sky`` backend with torch (once per process)."""
    global _registered
    with _registry_lock:
        if _registered:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        if torch._C._get_privateuse1_backend_name() not in ("privateuseone", BACKEND):
            raise DeviceError("another library already registered torch's custom device "
                              f"({torch._C._get_privateuse1_backend_name()!r}); the sky device needs it", op="")
        _setup_privateuseone_for_python_backend(BACKEND, backend_module=_DeviceModule())
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("empty.memory_format", _empty, "PrivateUse1")
        lib.impl("empty_strided", _empty_strided, "PrivateUse1")
        lib.impl("_copy_from", _copy_from, "PrivateUse1")
        lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
        globals()["_lib"] = lib  # (the registrations live as long as the library object)
        _registered = True


def attach(link: Link, kind: str, real: str, key: str) -> RemoteDevice:
    """A new ``sky:N`` for a session opened on ``link``'s node."""
    register()
    with _registry_lock:
        index = 0
        while index in _devices:
            index += 1
        dev = RemoteDevice(index, link, kind, real, key)
        _devices[index] = dev
    return dev


def detach(dev: RemoteDevice, reason: str) -> None:
    """Close ``dev``: its index can be given out again; its handles raise from now on."""
    with dev._lock:
        dev.closed = reason
        dev._ops.clear()
        dev._frees.clear()
    with _registry_lock:
        if _devices.get(dev.index) is dev:
            del _devices[dev.index]
