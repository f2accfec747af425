"""What travels between the client's ``sky`` tensors and a node's device server.

A batch is a list of operations, pickled with the C pickler (protocol 5, large tensor bytes
out of band). One operation is ``(op, args, kwargs, outs)``:

- ``op``: the aten overload's name (``"aten.add.Tensor"``), or one of the ``OP_*`` names below;
- ``args``/``kwargs``: the call's arguments, where a ``sky`` tensor is a :class:`Ref` to the
  server's table, a ``sky`` device a :class:`DeviceRef` and a client tensor a :class:`Blob`;
- ``outs``: for each tensor the call returns (in ``torch.utils._pytree`` leaf order), the id the
  client gave its handle, or ``None`` where the output is one of the inputs (an in-place op).

Imported by the client and by the worker: nothing here may import the client's backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Drop these ids from the table (batched frees).
OP_FREE = "$free"
#: Seed every generator of the node's device (``torch.manual_seed`` on the client).
OP_SEED = "$seed"
#: ``(state,)``: set the generator of the node's device to ``state`` (a CPU byte tensor's Blob).
OP_RNG = "$rng"
#: ``(qualname, module, schema, mutates, fn)``: make the custom operator ``qualname`` (registered
#: in the client through ``torch.library.custom_op``) exist here: import ``module``, where it is
#: defined, or else define it from ``fn``, its implementation pickled by value.
OP_DEFINE = "$define"
#: ``(src, xid, address, port)``: send tensor ``src``'s bytes to the worker at address:port.
OP_SEND = "$send"
#: ``(dst, xid, sender, shape, dtype, new)``: take transfer ``xid`` from worker ``sender`` as a
#: tensor of ``shape``/``dtype``; store it as ``dst`` (``new``) or copy it into ``dst``.
OP_RECV = "$recv"

#: Client tensors smaller than this travel inside the batch's pickle; larger ones as buffers.
INLINE_BYTES = 64 * 1024


class Ref(int):
    """A ``sky`` tensor: its id in the device server's table."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (int(self),))


class DeviceRef(int):
    """A ``sky`` device (``torch.device("sky:N")``), by its index N."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeviceRef, (int(self),))


class Blob:
    """A tensor's bytes with its dtype, shape and strides (on the CPU). A tensor whose elements
    are dense in some order (a transpose, channels-last) travels as it is laid out, and arrives
    with the same strides; any other arrives contiguous."""

    __slots__ = ("data", "dtype", "shape", "stride")

    def __init__(self, data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...],
                 stride: tuple[int, ...] | None = None):
        self.data = data
        self.dtype = dtype
        self.shape = shape
        self.stride = stride  # (None: contiguous)

    @classmethod
    def of(cls, tensor: torch.Tensor, *, copy: bool) -> Blob:
        """The bytes of a CPU ``tensor`` (a copy if ``copy``: the caller may change it later)."""
        t = tensor.detach().resolve_conj().resolve_neg()
        stride = None
        flat = None
        if t.dim() > 1 and not t.is_contiguous():
            order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))
            dense = t.permute(order)
            if dense.is_contiguous():  # (the same elements, outermost first: no copy)
                stride, flat = tuple(t.stride()), dense.reshape(-1)
        if flat is None:
            flat = t.contiguous().reshape(-1)
        if flat.numel() == 1:  # (one element is "contiguous" whatever its stride: make it 1)
            flat = flat.as_strided((1,), (1,))
        data = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
        return cls(data.copy() if copy else data, tensor.dtype, tuple(tensor.shape), stride)

    def tensor(self) -> torch.Tensor:
        """A CPU tensor over these bytes (sharing them when they can be written to)."""
        data = self.data if self.data.flags.writeable else self.data.copy()
        flat = torch.from_numpy(data).view(self.dtype)
        if self.stride is not None:
            return flat.as_strided(self.shape, self.stride)
        return flat.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Blob, (self.data, self.dtype, self.shape, self.stride))


class Expect(list):  # type: ignore[type-arg]
    """``outs`` of an operation the client runs with a signature for the first time: the ids,
    and in ``meta`` what the client assumed of each new output (``(size, stride, offset)``, or
    None). The node checks them and reports what differs at the next answer."""

    __slots__ = ("meta",)

    def __init__(self, tids: list[int | None], meta: list[Any]):
        super().__init__(tids)
        self.meta = meta

    def __reduce__(self) -> tuple[Any, ...]:
        return (Expect, (list(self), self.meta))


class Described:
    """A tensor an operation produced, described by the server (for operations whose output
    shape only the data decides, such as ``nonzero``): the id it was stored under and its
    metadata."""

    __slots__ = ("dtype", "offset", "size", "stride", "tid")

    def __init__(self, tid: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int, dtype: torch.dtype):
        self.tid = tid
        self.size = size
        self.stride = stride
        self.offset = offset
        self.dtype = dtype

    def __reduce__(self) -> tuple[Any, ...]:
        return (Described, (self.tid, self.size, self.stride, self.offset, self.dtype))
