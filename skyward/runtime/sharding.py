"""Split data across the nodes of a pool: :func:`shard`.

This module is imported by :mod:`skyward.runtime` (and so on every worker), so it imports
nothing heavy: numpy, torch and pandas are recognised only when the caller has already
imported them, by looking them up in :data:`sys.modules`; they are never imported here.
"""

from __future__ import annotations

import operator
import random
import sys
from typing import Any, overload

from skyward.runtime.instance import instance_info
from skyward.errors import ConfigError

__all__ = ["shard"]

#: What :func:`shard` accepts, in words (used in error messages).
SUPPORTED = (
    "a list, tuple, range, numpy.ndarray (at least 1-D), torch.Tensor (at least 1-D), "
    "pandas.DataFrame or pandas.Series"
)

# The indices one node takes: a range when the order is not shuffled (so that slicing can be
# used), a list of positions when it is.
_Selection = range | list[int]


@overload
def shard(
    array: Any,
    /,
    *,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    node: int | None = None,
    total_nodes: int | None = None,
) -> Any: ...
@overload
def shard(
    array: Any,
    other: Any,
    /,
    *arrays: Any,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    node: int | None = None,
    total_nodes: int | None = None,
) -> tuple[Any, ...]: ...
def shard(
    *arrays: Any,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    node: int | None = None,
    total_nodes: int | None = None,
) -> Any:
    """Return this node's share of one or more arrays.

    Node ``k`` of ``n`` gets the items at positions ``k, k + n, k + 2n, ...`` (modulo
    striding), so shares differ in size by at most one item and together cover the data
    exactly once.

    * ``node`` / ``total_nodes`` default to this worker process's place in the pool: its
      ``rank`` among ``world_size`` processes (:func:`skyward.instance_info`; with one process
      per node, the node and the node count); outside a pool that is 0 of 1, so
      ``shard`` returns everything. Passing either one explicitly overrides the pool's value.
    * Several arrays are split with the *same* positions, so ``x[i]`` and ``y[i]`` still
      belong together afterwards. They must all have the same length.
    * ``shuffle=True`` first permutes the positions with ``random.Random(seed)``; every node
      computes the same permutation (pass the same ``seed`` everywhere, e.g. the epoch
      number), then strides over it.
    * ``drop_last=True`` first drops the tail of the (shuffled) order so that each node gets
      exactly ``len // total_nodes`` items.

    Types are preserved: a list gives a list, a tuple a tuple (subclasses of either come back
    as a plain list / tuple), a range a range (but a **list** when ``shuffle=True``, since a
    shuffled selection is no longer an arithmetic progression), a numpy array a numpy array
    (a copy, selected along axis 0), a torch tensor a tensor on the same device (selected
    along dim 0 with ``index_select``), a pandas DataFrame or Series the same type with its
    rows selected by position and the original index labels kept. Any other type raises
    :class:`~skyward.errors.ConfigError`. Empty input gives empty output of the same type.

    One array in gives one value back; several give a tuple in the same order.

    >>> shard(list(range(10)), node=1, total_nodes=3)
    [1, 4, 7]
    >>> shard(range(10), node=1, total_nodes=3, drop_last=True)
    range(1, 9, 3)
    >>> xs, ys = shard(["a", "b", "c", "d"], [0, 1, 2, 3], node=0, total_nodes=2)
    >>> xs, ys
    (['a', 'c'], [0, 2])

    Raises :class:`~skyward.errors.ConfigError` when no array is given, an array has an
    unsupported type, the lengths differ, ``total_nodes < 1`` or ``node`` is not in
    ``[0, total_nodes)``.
    """
    if not arrays:
        raise ConfigError("arrays", "at least one array to shard", (), detail=f"supported types: {SUPPORTED}")
    shuffle = bool(shuffle)
    drop_last = bool(drop_last)
    seed = _as_int("seed", seed, "an integer (the same on every node)")
    node, total_nodes = _resolve_node(node, total_nodes)

    kinds = [_kind(i, a) for i, a in enumerate(arrays)]
    lengths = [_length(kind, a) for kind, a in zip(kinds, arrays)]
    if len(set(lengths)) > 1:
        raise ConfigError(
            "arrays",
            "arrays of equal length",
            tuple(lengths),
            detail="lengths " + ", ".join(str(n) for n in lengths),
        )

    selection = _select(lengths[0], node, total_nodes, shuffle=shuffle, seed=seed, drop_last=drop_last)
    results = tuple(_take(kind, a, selection) for kind, a in zip(kinds, arrays))
    return results[0] if len(results) == 1 else results


# ---------------------------------------------------------------------------------------------
# Arguments.


def _as_int(parameter: str, value: object, accepted: str) -> int:
    """``value`` as a plain int (accepting numpy integers and the like, but not bools)."""
    if isinstance(value, bool):
        raise ConfigError(parameter, accepted, value)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(parameter, accepted, value) from None


def _resolve_node(node: int | None, total_nodes: int | None) -> tuple[int, int]:
    """Fill in ``node``/``total_nodes`` from the pool where not given, and check them."""
    node_from_pool = node is None
    total_from_pool = total_nodes is None
    if node_from_pool or total_from_pool:
        info = instance_info()  # one share per worker process: by global rank
        if node is None:
            node = info.rank
        if total_nodes is None:
            total_nodes = info.world_size

    n = _as_int("total_nodes", total_nodes, "an integer >= 1")
    if n < 1:
        where = " (taken from the pool)" if total_from_pool else ""
        raise ConfigError("total_nodes", "an integer >= 1", n, detail=f"total_nodes must be positive{where}")
    k = _as_int("node", node, f"an integer in [0, {n})")
    if not 0 <= k < n:
        if node_from_pool:
            detail = f"node {k} comes from the pool, but total_nodes={n} was passed; pass node= too"
        elif total_from_pool:
            detail = f"the pool has {n} node(s); pass total_nodes= to shard for another count"
        else:
            detail = f"total_nodes={n}"
        raise ConfigError("node", f"an integer in [0, {n})", k, detail=detail)
    return k, n


# ---------------------------------------------------------------------------------------------
# Types. Third-party types are recognised only if their library is already imported: an object
# of that type cannot exist otherwise, and importing skyward must never import them.


def _loaded_class(module: str, name: str) -> type | None:
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return cls if isinstance(cls, type) else None


def _kind(position: int, array: object) -> str:
    """Name the supported type ``array`` is, or raise ConfigError."""
    if isinstance(array, list):
        return "list"
    if isinstance(array, tuple):
        return "tuple"
    if isinstance(array, range):
        return "range"

    ndarray = _loaded_class("numpy", "ndarray")
    if ndarray is not None and isinstance(array, ndarray):
        if array.ndim == 0:  # type: ignore[attr-defined]
            raise ConfigError(
                "arrays", "arrays with at least one dimension", array, detail=f"argument {position} is a 0-d numpy array"
            )
        return "numpy"

    tensor = _loaded_class("torch", "Tensor")
    if tensor is not None and isinstance(array, tensor):
        if array.dim() == 0:  # type: ignore[attr-defined]
            raise ConfigError(
                "arrays", "arrays with at least one dimension", array, detail=f"argument {position} is a 0-d torch tensor"
            )
        return "torch"

    for name in ("DataFrame", "Series"):
        cls = _loaded_class("pandas", name)
        if cls is not None and isinstance(array, cls):
            return "pandas"

    cls = type(array)
    type_name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    raise ConfigError(
        "arrays",
        SUPPORTED,
        type_name,
        detail=f"argument {position} has unsupported type {type_name}; convert it to a list or numpy array first",
    )


def _length(kind: str, array: Any) -> int:
    if kind in ("numpy", "torch"):
        return int(array.shape[0])
    return len(array)


# ---------------------------------------------------------------------------------------------
# Selection.


def _select(length: int, node: int, total_nodes: int, *, shuffle: bool, seed: int, drop_last: bool) -> _Selection:
    """The positions node ``node`` of ``total_nodes`` takes, in order."""
    stop = (length // total_nodes) * total_nodes if drop_last else length
    if not shuffle:
        return range(node, stop, total_nodes)
    order = list(range(length))
    random.Random(seed).shuffle(order)
    return order[:stop][node::total_nodes]


def _take(kind: str, array: Any, selection: _Selection) -> Any:
    """``array`` restricted to the positions in ``selection``, same type where possible."""
    strided = isinstance(selection, range)
    if kind == "list":
        if strided:
            picked = array[selection.start : selection.stop : selection.step]
            return picked if type(picked) is list else list(picked)
        return [array[i] for i in selection]
    if kind == "tuple":
        if strided:
            return tuple(array[selection.start : selection.stop : selection.step])
        return tuple(array[i] for i in selection)
    if kind == "range":
        if strided:
            return array[selection.start : selection.stop : selection.step]
        return [array[i] for i in selection]
    if kind in ("numpy", "pandas"):
        # A copy (not a view) either way, so that the share never aliases the input.
        np = sys.modules["numpy"]
        if strided:
            index = np.arange(selection.start, selection.stop, selection.step, dtype=np.intp)
        else:
            index = np.asarray(selection, dtype=np.intp)
        # pandas: .iloc selects rows by position and keeps their index labels.
        return array.iloc[index] if kind == "pandas" else array[index]
    if kind == "torch":
        torch = sys.modules["torch"]
        if strided and len(selection):
            index = torch.arange(selection.start, selection.stop, selection.step, dtype=torch.long, device=array.device)
        else:
            index = torch.tensor(list(selection), dtype=torch.long, device=array.device)
        return array.index_select(0, index)
    raise AssertionError(f"unhandled kind {kind!r}")  # pragma: no cover
