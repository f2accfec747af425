"""The client's ``sky`` device: the devices open in this process and the batches sent to them.

A :class:`~skyward.torch._tensor.SkyTensor` is a handle: shape, strides, dtype and an id in its
node's table, never the data. Every aten operation on one reaches ``__torch_dispatch__``
(:mod:`skyward.torch._dispatch`), which

1. works out the outputs' metadata by running the operation on ``meta`` tensors, once per
   signature (operation, input shapes/strides/dtypes, non-float arguments): later calls with
   the same signature reuse the answer. The node checks a signature's first outputs against
   that, and its next answer corrects the handles and the plan where they differ;
2. gives each new output a handle and an id, and queues ``(op, arguments, output ids)`` on the
   device (:class:`RemoteDevice`, here);
3. returns the handles at once. Queued operations go to the node in batches, as tasks of the
   pool; the client waits only where it needs a value (``.item()``, ``.cpu()``, printing...):
   one round trip per sync point.

An operation whose outputs depend on the data (``nonzero``, ``item``) runs at once on the node,
which describes what it made. Handles freed here are freed there, in the next batch. Copies
between the client and nodes, and between nodes, are :mod:`skyward.torch._copies`; the
``torch.sky`` module is :mod:`skyward.torch._module`.
"""

from __future__ import annotations

import collections
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from skyward.errors import DeviceError
from skyward.torch._wire import INLINE_BYTES, OP_FREE, OP_RECV, OP_SEED, OP_SEND

BACKEND = "sky"
#: A batch goes out when it holds this many operations...
BATCH_OPS = 256
#: ... or this many bytes of client tensors, or when its first operation is this old (seconds).
BATCH_BYTES = 1 << 20
BATCH_AGE = 0.005

_devices: dict[int, RemoteDevice] = {}
_registry_lock = threading.Lock()
_engine_threads = [True]  # (whether autograd ran multithreaded before the first device opened)
#: What a node's worker asks of a peer before it accepts a node-to-node copy from it. Made
#: here, per client process; it reaches the workers over the pool's own channels only.
SECRET = os.urandom(32)
#: Called with (device, corrections) after each answer while the device has outputs the node
#: checks: the dispatcher's (skyward.torch._dispatch.correct), set when it is imported.
ON_ANSWER: list[Callable[[RemoteDevice, list[tuple[Any, ...]]], None]] = []



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
        #: id -> (handle, plan key, step) of outputs the node checks (first use of a signature):
        #: its answer's corrections fix these handles and plans.
        self.watched: dict[int, tuple[Any, ...]] = {}
        #: A copy from another node is queued here and not yet waited on (see :meth:`sync`).
        self.incoming = False
        #: Custom operators (and torch namespaces) the node was told of.
        self.defined: set[str] = set()
        #: Operations sent and batches sent (for benchmarks and tests).
        self.sent_ops = 0
        self.sent_batches = 0

    def __repr__(self) -> str:
        return f"<sky:{self.index} = node {self.link.node}'s {self.real}>"

    # -- handles ---------------------------------------------------------------------------------
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
        """Send what is queued with ``request`` and wait for its answer: one round trip.

        Copies from other nodes that are on their way here, or from here to devices that have not
        been waited on since, land first: a sync point sees every copy queued before it."""
        for other in list(_devices.values()):
            if other is not self and other.incoming:
                other.incoming = False
                other.wait()
        with self._lock:
            self.incoming = False
            self.check_open()
            blob, buffers = self._batch()
            seq = self._seq
            self._seq += 1
            self.sent_batches += 1
            try:
                value, corrections = self.link.call(self._run, (self.key, seq, blob, request, *buffers))
            except DeviceError as exc:
                if exc.op in (OP_RECV, OP_SEND):  # a copy with another node broke: was it lost?
                    lost = lost_peer(str(exc))
                    if lost is not None:
                        raise lost from exc
                raise
            if self.watched:
                for hook in ON_ANSWER:
                    hook(self, corrections)
            return value

    def seed(self, seed: int) -> None:
        with self._lock:
            if self.closed is None:
                self.queue((OP_SEED, (seed,), None, None))

    def wait(self) -> None:
        """Wait until every queued operation has run (``torch.sky.synchronize()``)."""
        self.sync(("noop",))


def lost_peer(message: str, wait: float = 5.0) -> BaseException | None:
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


def _device(index: int | None) -> RemoteDevice:
    dev = _devices.get(0 if index is None else index)
    if dev is None:
        raise DeviceError(f"sky:{index} is not open: get a device from a Compute (node.device(...)) first",
                          op="", device=f"sky:{index}")
    return dev


def attach(link: Link, kind: str, real: str, key: str) -> RemoteDevice:
    """A new ``sky:N`` for a session opened on ``link``'s node (torch knows the backend:
    :func:`skyward.torch._module.register`)."""
    with _registry_lock:
        index = 0
        while index in _devices:
            index += 1
        dev = RemoteDevice(index, link, kind, real, key)
        if not _devices:
            # The autograd engine's per-device threads do not know a Python-registered device (it
            # sizes their queues once, by a device count of 1): backward through sky tensors
            # runs on the calling thread, as CPU work does anyway.
            _engine_threads[0] = torch._C._is_multithreading_enabled()
            torch._C._set_multithreading_enabled(False)
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
            if not _devices:
                torch._C._set_multithreading_enabled(_engine_threads[0])

