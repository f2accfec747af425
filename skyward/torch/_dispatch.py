"""Every aten operation on a ``sky`` tensor: its outputs' metadata worked out here (on ``meta``
tensors, once per signature), the operation queued for the node, handles returned at once."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree

from skyward.errors import DeviceError
from skyward.torch._backend import BACKEND, ON_ANSWER, RemoteDevice, _device
from skyward.torch._tensor import SkyTensor, new_handle
from skyward.torch._wire import OP_DEFINE, INLINE_BYTES, Blob, DeviceRef, Described, Expect, Ref

# Operations that always need the node's answer (their result is a value, not a tensor).
_SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.equal.default", "aten.is_nonzero.default"})
# Operations whose float arguments decide the output's shape (keyed by value, not by type).
_FLOAT_SHAPED = frozenset({"arange", "range", "linspace", "logspace", "histc"})
# Operations whose outputs the node need not check: they take their input's metadata as it is, or
# its dense layout, the same on meta as on any device; and model.to() swaps their outputs into
# parameters (torch.utils.swap_tensors), which a weak reference to them would prevent.
_UNWATCHED = frozenset({"aten.detach.default", "aten.alias.default", "aten._to_copy.default"})
_UNSUPPORTED = {
    "aten._pin_memory.default": "pin_memory()",
    "aten.is_pinned.default": "is_pinned()",
}

#: Operations with a path of their own (copies: skyward.torch._copies adds them), by name.
SPECIAL: dict[str, Any] = {}
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
        if x.layout != torch.strided:
            raise NotImplementedError(f"{x.layout} tensors are not supported on a sky device (only torch.strided: "
                                      "convert with .to_dense() first)")
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
        m = base.as_strided(size, stride, offset)
        if x.is_conj():
            torch._C._set_conj(m, True)
        if x.is_neg():
            torch._C._set_neg(m, True)
        return m
    if type(x) is torch.device and x.type == BACKEND:
        return torch.device("meta")
    return x


def _plan(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on meta tensors: what each output is (an input, a new tensor, a value)."""
    meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    try:
        out = func(*meta_args, **meta_kwargs)
    except Exception:
        # Data-dependent (nonzero, allclose, repeat_interleave's tensor repeats), no meta kernel,
        # or the call's own fault (mismatched shapes): the node runs it at once, and its answer,
        # or its error in the device's own words, is the truth.
        return _SYNC
    leaves, spec = pytree.tree_flatten(out)
    for v in leaves:
        if isinstance(v, torch.Tensor) and v.layout != torch.strided:
            raise NotImplementedError(f"{v.layout} tensors are not supported on a sky device ({func} makes one): "
                                      "only torch.strided; keep sparse work on the CPU or densify it first")
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
                bits = (v.is_conj(), v.is_neg()) if v.is_complex() or v.is_neg() else None
                plan.append(("new", tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, bits))
        else:
            plan.append(("value", v))
    single = spec.is_leaf() if hasattr(spec, "is_leaf") else False
    return (tuple(plan), spec, single)


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], generic: bool = False) -> Any:
    name = _names.get(func)
    if name is None:
        name = _names[func] = str(func)
    special = None if generic else SPECIAL.get(name)
    if special is not None:
        return special(func, args, kwargs)
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"{_UNSUPPORTED[name]} is not supported on a sky device")
    if "sparse" in name and func._opname.lstrip("_").startswith(("to_sparse", "sparse_")):
        layout = kwargs.get("layout") or "sparse"
        raise NotImplementedError(f"{layout} tensors are not supported on a sky device ({name}): only torch.strided; "
                                  "keep sparse work on the CPU or densify it first")
    found: list[Any] = []
    by_value = func._opname in _FLOAT_SHAPED
    sig_args, enc_args = _walk(args, found, by_value)
    sig_kwargs, enc_kwargs = _walk(kwargs, found, by_value) if kwargs else ((), {})
    dev = _device_of(found)
    if func.namespace != "aten" and func.namespace not in dev.defined and func._schema.name not in dev.defined:
        _define(dev, func)
    key = (func, sig_args, sig_kwargs)
    plan = _plans.get(key)
    fresh = plan is None
    if fresh:
        plan = _SYNC if name in _SYNC_OPS else _plan(func, args, kwargs)
        _plans[key] = plan
    with dev._lock:
        dev.check_open()
        nbytes, big = _blobs(found, enc_args, enc_kwargs)
        if nbytes:
            enc_args, enc_kwargs = _encode_cpu(enc_args), _encode_cpu(enc_kwargs)
        if plan is _SYNC:
            return run_now(dev, name, enc_args, enc_kwargs)
        steps, spec, single = plan
        outs: list[int | None] = []
        results: list[Any] = []
        tensors = [v for v in found if isinstance(v, torch.Tensor)]
        for step in steps:
            kind = step[0]
            if kind == "new":
                h = new_handle(dev, step[1], step[2], step[3], step[4])
                if step[5] is not None:
                    torch._C._set_conj(h, step[5][0])
                    torch._C._set_neg(h, step[5][1])
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
        if fresh and name not in _UNWATCHED:
            outs = _watch(dev, key, steps, outs, results)
        dev.queue((name, enc_args, enc_kwargs, outs), nbytes)
        if big:
            dev.flush()  # (now, while the client tensor is as it was: it was not copied)
    if single:
        return results[0]
    return pytree.tree_unflatten(results, spec)


def _define(dev: RemoteDevice, func: Any) -> None:
    """Before ``func``'s first use on ``dev``: queue what the node needs to have the operator (an
    operator of torch's own, or one this process registered with ``torch.library.custom_op``)."""
    from torch._library.custom_ops import OPDEFS

    from skyward.compute import function_blob

    qualname = func._schema.name
    if func.namespace in ("prims", "_c10d_functional", "quantized", "_quantized", "profiler"):
        dev.defined.add(func.namespace)  # (torch's own: there on the node too)
        return
    opdef = OPDEFS.get(qualname)
    schema = str(func._schema)
    schema = schema[schema.index("("):]
    mutates = [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
    fn = function_blob(opdef._init_fn) if opdef is not None else None
    with dev._lock:
        dev.queue((OP_DEFINE, (qualname, module, schema, mutates, fn), None, None))
    dev.defined.add(qualname)


def _watch(dev: RemoteDevice, key: Any, steps: Any, outs: list[int | None], results: list[Any]) -> Expect:
    """``outs`` for the node to check against this plan (its first use), and the handles to fix."""
    meta: list[Any] = []
    for step, r in zip(steps, results, strict=True):
        if step[0] == "value":
            continue
        if step[0] == "new":
            meta.append((tuple(step[1]), tuple(step[2]), int(step[3])))
            dev.watched[r._tid] = (weakref.ref(r), key, len(meta) - 1)
        else:
            meta.append(None)
    return Expect(outs, meta)


def correct(dev: RemoteDevice, corrections: list[tuple[Any, ...]]) -> None:
    """Apply the node's word on outputs whose metadata differed from their meta kernel's: fix the
    handles still alive and the plan, so the signature's later calls are right from the start."""
    for tid, size, stride, offset in corrections:
        seen = dev.watched.get(tid)
        if seen is None:
            continue
        ref, key, index = seen
        h = ref()
        if type(h) is SkyTensor and h._tid == tid:  # (alive, and not swapped away since)
            _reshape(h, size, stride, offset)
        plan = _plans.get(key)
        if plan is not None and plan is not _SYNC:
            steps = list(plan[0])
            positions = [j for j, s in enumerate(steps) if s[0] != "value"]
            old = steps[positions[index]]
            steps[positions[index]] = ("new", tuple(size), tuple(stride), offset, old[4], old[5])
            _plans[key] = (tuple(steps), plan[1], plan[2])
    dev.watched.clear()


def _reshape(t: SkyTensor, size: Any, stride: Any, offset: int) -> None:
    """Give handle ``t`` new metadata in place (its node's tensor was resized or restrided)."""
    conj, neg = t.is_conj(), t.is_neg()
    shell = torch.Tensor._make_wrapper_subclass(  # (no id: its end frees nothing)
        SkyTensor, size, strides=stride, storage_offset=offset, dtype=t.dtype, device=t.device
    )
    t.data = shell
    if conj or neg:
        torch._C._set_conj(t, conj)
        torch._C._set_neg(t, neg)


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


def run_now(dev: RemoteDevice, name: str, enc_args: Any, enc_kwargs: Any) -> Any:
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



def generic(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` the ordinary way, past its special path (a special path's fallback)."""
    return dispatch(func, args, kwargs, generic=True)



SkyTensor.handler = staticmethod(dispatch)
ON_ANSWER.append(correct)
