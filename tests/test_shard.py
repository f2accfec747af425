"""``sky.shard`` (also ``skyward.runtime.shard``): each node's part of the data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from skyward import shard
from skyward.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# Helpers: build each supported type from a list of ints, and read back the ints it holds, so
# one set of checks covers every type.


def _torch():
    return pytest.importorskip("torch")


def make_list(values: list[int]) -> Any:
    return list(values)


def make_tuple(values: list[int]) -> Any:
    return tuple(values)


def make_numpy(values: list[int]) -> Any:
    return np.array(values, dtype=np.int64)


def make_numpy_2d(values: list[int]) -> Any:
    # Row i is [v, -v]: checks that whole rows move along axis 0.
    return np.array([[v, -v] for v in values], dtype=np.int64).reshape(len(values), 2)


def make_torch(values: list[int]) -> Any:
    torch = _torch()
    return torch.tensor(values, dtype=torch.int64)


def make_torch_2d(values: list[int]) -> Any:
    torch = _torch()
    return torch.tensor([[v, -v] for v in values], dtype=torch.int64).reshape(len(values), 2)


def make_series(values: list[int]) -> Any:
    # Non-default labels, so that keeping the original labels is observable.
    return pd.Series(values, index=[f"r{v}" for v in values], dtype="int64")


def make_frame(values: list[int]) -> Any:
    return pd.DataFrame({"a": values, "b": [-v for v in values]}, index=[f"r{v}" for v in values])


def values_of(x: Any) -> list[int]:
    """The data a shard holds, as the list of ints it was built from (first column)."""
    if isinstance(x, (list, tuple, range)):
        return [int(v) for v in x]
    if isinstance(x, np.ndarray):
        return [int(v) for v in (x[:, 0] if x.ndim == 2 else x)]
    if isinstance(x, pd.DataFrame):
        return [int(v) for v in x["a"]]
    if isinstance(x, pd.Series):
        return [int(v) for v in x]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return [int(v) for v in (x[:, 0] if x.dim() == 2 else x).tolist()]
    raise AssertionError(f"unexpected type {type(x)}")


MAKERS: dict[str, Callable[[list[int]], Any]] = {
    "list": make_list,
    "tuple": make_tuple,
    "numpy": make_numpy,
    "numpy2d": make_numpy_2d,
    "torch": make_torch,
    "torch2d": make_torch_2d,
    "series": make_series,
    "frame": make_frame,
}


def data(kind: str, values: list[int]) -> Any:
    if kind == "range":
        assert values == list(range(len(values)))
        return range(len(values))
    return MAKERS[kind](values)


KINDS = [*MAKERS, "range"]


def all_shards(x: Any, n: int, **kw: Any) -> list[Any]:
    return [shard(x, node=k, total_nodes=n, **kw) for k in range(n)]


def expected_type(kind: str, shuffle: bool) -> type:
    if kind == "range":
        return list if shuffle else range
    if kind.startswith("torch"):
        return _torch().Tensor
    return {
        "list": list,
        "tuple": tuple,
        "numpy": np.ndarray,
        "numpy2d": np.ndarray,
        "series": pd.Series,
        "frame": pd.DataFrame,
    }[kind]


# ---------------------------------------------------------------------------------------------
# Striding and coverage.


@pytest.mark.parametrize("kind", KINDS)
def test_modulo_striding_exact_values(kind: str) -> None:
    x = data(kind, list(range(10)))
    shards = all_shards(x, 3)
    assert [values_of(s) for s in shards] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    for s in shards:
        assert type(s) is expected_type(kind, shuffle=False)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 13])
@pytest.mark.parametrize("shuffle", [False, True])
def test_union_is_whole_data_without_overlap(kind: str, n: int, shuffle: bool) -> None:
    length = 10
    x = data(kind, list(range(length)))
    shards = all_shards(x, n, shuffle=shuffle, seed=5)
    got = [v for s in shards for v in values_of(s)]
    assert len(got) == length  # no duplicates, nothing missing
    assert sorted(got) == list(range(length))
    sizes = [len(values_of(s)) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [len(range(k, length, n)) for k in range(n)]
    for s in shards:
        assert type(s) is expected_type(kind, shuffle)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 3, 4, 7, 10, 13])
@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_gives_equal_counts_without_overlap(kind: str, n: int, shuffle: bool) -> None:
    length = 10
    x = data(kind, list(range(length)))
    shards = all_shards(x, n, shuffle=shuffle, seed=11, drop_last=True)
    sizes = [len(values_of(s)) for s in shards]
    assert sizes == [length // n] * n
    got = [v for s in shards for v in values_of(s)]
    assert len(set(got)) == len(got) == (length // n) * n
    assert set(got) <= set(range(length))
    for s in shards:
        assert type(s) is expected_type(kind, shuffle)


def test_drop_last_without_shuffle_drops_the_tail() -> None:
    shards = all_shards(list(range(10)), 3, drop_last=True)
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert shard(range(10), node=1, total_nodes=3, drop_last=True) == range(1, 9, 3)


def test_drop_last_with_shuffle_drops_the_tail_of_the_shuffled_order() -> None:
    # With one node, shuffle + drop_last keeps everything; with 4 nodes over 10 items, the two
    # items dropped are the last two of the permutation, which is the one a single node sees.
    order = shard(list(range(10)), node=0, total_nodes=1, shuffle=True, seed=3)
    kept = [v for s in all_shards(list(range(10)), 4, shuffle=True, seed=3, drop_last=True) for v in s]
    assert sorted(kept) == sorted(order[:8])
    assert set(range(10)) - set(kept) == set(order[8:])


def test_more_nodes_than_items() -> None:
    shards = all_shards([10, 20], 4)
    assert shards == [[10], [20], [], []]
    assert all_shards([10, 20], 4, drop_last=True) == [[], [], [], []]


# ---------------------------------------------------------------------------------------------
# Shuffle.


def test_shuffle_is_a_permutation_striding_the_shuffled_order() -> None:
    whole = shard(list(range(100)), node=0, total_nodes=1, shuffle=True, seed=1)
    assert sorted(whole) == list(range(100))
    assert whole != list(range(100))
    for k in range(3):
        assert shard(list(range(100)), node=k, total_nodes=3, shuffle=True, seed=1) == whole[k::3]


def test_shuffle_matches_random_random_on_indices() -> None:
    import random

    order = list(range(20))
    random.Random(42).shuffle(order)
    assert shard(list(range(20)), node=1, total_nodes=4, shuffle=True, seed=42) == order[1::4]


@pytest.mark.parametrize("kind", KINDS)
def test_shuffle_reproducible_for_same_seed_and_differs_for_another(kind: str) -> None:
    x = data(kind, list(range(50)))
    first = [values_of(s) for s in all_shards(x, 3, shuffle=True, seed=7)]
    again = [values_of(s) for s in all_shards(x, 3, shuffle=True, seed=7)]
    other = [values_of(s) for s in all_shards(x, 3, shuffle=True, seed=8)]
    assert first == again
    assert first != other
    assert first != [values_of(s) for s in all_shards(x, 3)]  # actually shuffled


def test_shuffle_identical_in_another_process() -> None:
    # Every node computes the permutation on its own: it must not depend on the process.
    code = (
        "from skyward import shard;"
        "print(shard(list(range(30)), node=2, total_nodes=4, shuffle=True, seed=99))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    ).stdout
    assert out.strip() == str(shard(list(range(30)), node=2, total_nodes=4, shuffle=True, seed=99))


def test_seed_accepts_numpy_integer() -> None:
    a = shard(list(range(20)), node=0, total_nodes=2, shuffle=True, seed=np.int64(4))
    b = shard(list(range(20)), node=0, total_nodes=2, shuffle=True, seed=4)
    assert a == b


@pytest.mark.parametrize("seed", [None, 1.5, "7", True])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ConfigError) as err:
        shard([1, 2, 3], shuffle=True, seed=seed, node=0, total_nodes=1)  # type: ignore[arg-type]
    assert err.value.parameter == "seed"


# ---------------------------------------------------------------------------------------------
# Several arrays.


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_several_arrays_stay_aligned(shuffle: bool, drop_last: bool) -> None:
    torch = _torch()
    n = 17
    ids = list(range(n))
    labels = [f"item{i}" for i in ids]
    features = np.arange(n * 3).reshape(n, 3)  # row i is [3i, 3i+1, 3i+2]
    targets = torch.arange(n) * 10
    frame = pd.DataFrame({"id": ids}, index=[f"r{i}" for i in ids])
    seen: list[int] = []
    for k in range(3):
        out = shard(
            ids, labels, features, targets, frame, range(n),
            node=k, total_nodes=3, shuffle=shuffle, seed=2, drop_last=drop_last,
        )  # fmt: skip
        assert isinstance(out, tuple) and len(out) == 6
        s_ids, s_labels, s_features, s_targets, s_frame, s_range = out
        assert isinstance(s_ids, list)
        assert isinstance(s_labels, list)
        assert isinstance(s_features, np.ndarray)
        assert isinstance(s_targets, torch.Tensor)
        assert isinstance(s_frame, pd.DataFrame)
        assert isinstance(s_range, list if shuffle else range)
        assert s_labels == [f"item{i}" for i in s_ids]
        assert s_features.tolist() == [[3 * i, 3 * i + 1, 3 * i + 2] for i in s_ids]
        assert s_targets.tolist() == [10 * i for i in s_ids]
        assert s_frame["id"].tolist() == s_ids
        assert list(s_frame.index) == [f"r{i}" for i in s_ids]
        assert list(s_range) == s_ids
        seen += s_ids
    assert len(seen) == len(set(seen))
    assert len(seen) == (15 if drop_last else 17)


def test_one_array_returns_value_not_tuple() -> None:
    out = shard([1, 2, 3, 4], node=1, total_nodes=2)
    assert out == [2, 4]
    out1 = shard((1, 2, 3, 4), node=1, total_nodes=2)
    assert out1 == (2, 4)


def test_mismatched_lengths_raise_config_error_with_lengths() -> None:
    with pytest.raises(ConfigError) as err:
        shard(list(range(10)), np.arange(9), node=0, total_nodes=2)
    assert err.value.parameter == "arrays"
    assert "10" in str(err.value) and "9" in str(err.value)
    assert err.value.got == (10, 9)


def test_mismatched_lengths_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        shard([1, 2], [1], node=0, total_nodes=1)


# ---------------------------------------------------------------------------------------------
# Types.


def test_range_keeps_range_without_shuffle_and_gives_list_with_shuffle() -> None:
    r = range(5, 105, 2)  # not starting at 0, step 2: values, not positions, come back
    s = shard(r, node=1, total_nodes=4)
    assert s == range(7, 105, 8)
    assert type(s) is range
    shuffled = shard(r, node=1, total_nodes=4, shuffle=True, seed=0)
    assert type(shuffled) is list
    whole = shard(r, node=0, total_nodes=1, shuffle=True, seed=0)
    assert sorted(whole) == list(r)
    assert shuffled == whole[1::4]


def test_numpy_keeps_dtype_shape_and_copies() -> None:
    x = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
    s = shard(x, node=1, total_nodes=2)
    assert s.dtype == np.float32
    assert s.shape == (3, 2, 2)
    np.testing.assert_array_equal(s, x[1::2])
    s[...] = -1
    assert x.min() == 0  # the input is untouched
    sh = shard(x, node=1, total_nodes=2, shuffle=True, seed=3)
    assert sh.shape == (3, 2, 2)


def test_numpy_structured_and_object_arrays() -> None:
    objs = np.array([{"i": i} for i in range(5)], dtype=object)
    assert [d["i"] for d in shard(objs, node=0, total_nodes=2)] == [0, 2, 4]
    rec = np.array([(i, float(i)) for i in range(5)], dtype=[("a", "i4"), ("b", "f8")])
    assert shard(rec, node=1, total_nodes=2)["a"].tolist() == [1, 3]


def test_torch_keeps_dtype_device_and_shape() -> None:
    torch = _torch()
    x = torch.arange(30, dtype=torch.float64).reshape(10, 3)
    s = shard(x, node=2, total_nodes=3)
    assert isinstance(s, torch.Tensor)
    assert s.dtype == torch.float64
    assert s.device == x.device
    assert s.shape == (3, 3)
    assert torch.equal(s, x[2::3])
    sh = shard(x, node=2, total_nodes=3, shuffle=True, seed=1, drop_last=True)
    assert sh.shape == (3, 3)


def test_torch_keeps_autograd() -> None:
    torch = _torch()
    x = torch.arange(6, dtype=torch.float32, requires_grad=True)
    s = shard(x, node=0, total_nodes=2)
    s.sum().backward()
    assert x.grad.tolist() == [1, 0, 1, 0, 1, 0]


def test_pandas_keeps_index_labels_and_columns() -> None:
    df = pd.DataFrame({"a": range(10), "b": list("abcdefghij")}, index=range(100, 110))
    s = shard(df, node=1, total_nodes=3)
    assert type(s) is pd.DataFrame
    assert list(s.index) == [101, 104, 107]
    assert list(s.columns) == ["a", "b"]
    assert s["b"].tolist() == ["b", "e", "h"]
    ser = pd.Series(list("abcdefghij"), index=list("ABCDEFGHIJ"), name="letters")
    t = shard(ser, node=0, total_nodes=3, shuffle=True, seed=4)
    assert type(t) is pd.Series
    assert t.name == "letters"
    assert [label.lower() for label in t.index] == t.tolist()  # labels still match their values


def test_pandas_duplicate_labels_select_by_position() -> None:
    ser = pd.Series([0, 1, 2, 3], index=["x", "x", "y", "y"])
    s = shard(ser, node=1, total_nodes=2)
    assert s.tolist() == [1, 3]
    assert list(s.index) == ["x", "y"]


def test_list_and_tuple_subclasses_come_back_plain() -> None:
    class MyList(list):
        pass

    s = shard(MyList([1, 2, 3]), node=0, total_nodes=2)
    assert type(s) is list and s == [1, 3]


def test_shard_of_list_is_a_new_list() -> None:
    x = [1, 2, 3]
    s = shard(x, node=0, total_nodes=1)
    assert s == x and s is not x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_empty_input(kind: str, shuffle: bool, drop_last: bool) -> None:
    x = data(kind, [])
    for k in range(3):
        s = shard(x, node=k, total_nodes=3, shuffle=shuffle, drop_last=drop_last)
        assert type(s) is expected_type(kind, shuffle)
        assert values_of(s) == []


def test_empty_keeps_trailing_shape() -> None:
    s = shard(np.zeros((0, 4)), node=0, total_nodes=2)
    assert s.shape == (0, 4)
    torch = _torch()
    t = shard(torch.zeros((0, 4)), node=1, total_nodes=2, shuffle=True)
    assert tuple(t.shape) == (0, 4)
    df = shard(pd.DataFrame({"a": [], "b": []}), node=0, total_nodes=2)
    assert list(df.columns) == ["a", "b"] and len(df) == 0


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ("abcdef", "str"),
        (b"abc", "bytes"),
        ({1: 2}, "dict"),
        ({1, 2}, "set"),
        (iter([1, 2]), "list_iterator"),
        (5, "int"),
    ],
)
def test_unsupported_types_raise(value: object, type_name: str) -> None:
    with pytest.raises(ConfigError) as err:
        shard(value, node=0, total_nodes=1)
    assert err.value.parameter == "arrays"
    assert type_name in str(err.value)
    for supported in ("list", "tuple", "range", "numpy", "torch", "pandas"):
        assert supported in err.value.accepted


def test_other_sequences_are_rejected_explicitly() -> None:
    import array
    import collections

    for value in (array.array("i", [1, 2, 3]), collections.deque([1, 2, 3]), pd.Index([1, 2, 3])):
        with pytest.raises(ConfigError) as err:
            shard(value, node=0, total_nodes=1)
        assert err.value.parameter == "arrays"
        assert type(value).__qualname__ in str(err.value)


def test_unsupported_type_in_second_position_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        shard([1, 2], {"a": 1}, node=0, total_nodes=1)
    assert "argument 1" in str(err.value)
    assert "dict" in str(err.value)


def test_zero_dimensional_arrays_raise() -> None:
    with pytest.raises(ConfigError) as err:
        shard(np.array(3), node=0, total_nodes=1)
    assert err.value.parameter == "arrays"
    torch = _torch()
    with pytest.raises(ConfigError):
        shard(torch.tensor(3), node=0, total_nodes=1)


def test_no_arrays_raise() -> None:
    with pytest.raises(ConfigError) as err:
        shard(node=0, total_nodes=1)
    assert err.value.parameter == "arrays"


# ---------------------------------------------------------------------------------------------
# node / total_nodes.


@pytest.mark.parametrize("node", [-1, 3, 10])
def test_node_out_of_range(node: int) -> None:
    with pytest.raises(ConfigError) as err:
        shard([1, 2, 3], node=node, total_nodes=3)
    assert err.value.parameter == "node"
    assert err.value.got == node


@pytest.mark.parametrize("total", [0, -2])
def test_total_nodes_below_one(total: int) -> None:
    with pytest.raises(ConfigError) as err:
        shard([1, 2, 3], node=0, total_nodes=total)
    assert err.value.parameter == "total_nodes"
    assert err.value.got == total


@pytest.mark.parametrize(("node", "total", "param"), [(1.0, 2, "node"), ("0", 2, "node"), (0, 2.0, "total_nodes"), (True, 2, "node")])
def test_non_integer_node_values(node: object, total: object, param: str) -> None:
    with pytest.raises(ConfigError) as err:
        shard([1, 2, 3], node=node, total_nodes=total)  # type: ignore[arg-type]
    assert err.value.parameter == param


def test_numpy_integers_accepted_for_node() -> None:
    assert shard([1, 2, 3, 4], node=np.int64(1), total_nodes=np.int32(2)) == [2, 4]


def _pool_env(monkeypatch: pytest.MonkeyPatch, node: int, total: int) -> None:
    monkeypatch.setenv(
        "COMPUTE_POOL",
        json.dumps(
            {
                "node": node,
                "total_nodes": total,
                "head_addr": "10.0.0.1",
                "head_port": 29500,
                "accelerators": 0,
                "peers": [{"node": i, "addr": f"10.0.0.{i + 1}"} for i in range(total)],
                "pool_id": "pool-test",
            }
        ),
    )


def test_defaults_outside_a_pool_are_node_0_of_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPUTE_POOL", raising=False)
    assert shard([5, 6, 7]) == [5, 6, 7]
    assert shard(range(4), shuffle=True, seed=1, drop_last=True) != [0, 1, 2, 3]


def test_defaults_come_from_compute_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    _pool_env(monkeypatch, node=2, total=4)
    assert shard(list(range(10))) == [2, 6]
    x, y = shard(list(range(10)), np.arange(10) * 2)
    assert x == [2, 6] and y.tolist() == [4, 12]
    _pool_env(monkeypatch, node=0, total=4)  # a change of environment is picked up
    assert shard(list(range(10))) == [0, 4, 8]


def test_explicit_values_override_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    _pool_env(monkeypatch, node=2, total=4)
    assert shard(list(range(10)), node=1) == [1, 5, 9]  # total_nodes=4 from the pool
    assert shard(list(range(10)), total_nodes=3) == [2, 5, 8]  # node=2 from the pool
    assert shard(list(range(10)), node=0, total_nodes=2) == [0, 2, 4, 6, 8]


def test_pool_node_inconsistent_with_explicit_total(monkeypatch: pytest.MonkeyPatch) -> None:
    _pool_env(monkeypatch, node=3, total=4)
    with pytest.raises(ConfigError) as err:
        shard(list(range(10)), total_nodes=2)
    assert err.value.parameter == "node"
    assert "pool" in str(err.value)


def test_invalid_compute_pool_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPUTE_POOL", "{not json")
    with pytest.raises(ConfigError):
        shard([1, 2, 3])
    # Both given explicitly: the pool is not consulted at all.
    assert shard([1, 2, 3], node=0, total_nodes=1) == [1, 2, 3]


def test_runtime_reexports_shard() -> None:
    from skyward import runtime

    assert runtime.shard is shard


def test_importing_skyward_shard_imports_no_heavy_library() -> None:
    code = (
        "import sys, skyward.runtime;"
        "heavy = [m for m in ('numpy', 'pandas', 'torch') if m in sys.modules];"
        "assert not heavy, heavy;"
        "print(skyward.runtime.shard([1, 2, 3], node=1, total_nodes=2))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2]"
