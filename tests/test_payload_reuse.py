"""A call without arguments is serialized once per function (issue 35: the round trip's cost)."""

from __future__ import annotations

import pickle

import skyward as sky


def test_a_call_without_arguments_reuses_its_payload_and_a_new_function_gets_its_own() -> None:
    @sky.compute
    def noop() -> int:
        return 1

    first = noop().payload()
    assert noop().payload() is first  # made once, sent many times

    @sky.compute
    def noop() -> int:  # redefined: a new function object, so a new payload
        return 2

    second = noop().payload()
    assert second is not first
    fn_blob, args, kwargs = pickle.loads(second.data)
    assert pickle.loads(fn_blob)() == 2 and args == () and kwargs == {}


def test_a_call_with_arguments_is_serialized_each_time() -> None:
    @sky.compute
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert add(1).payload() is not add(1).payload()
    _, args, kwargs = pickle.loads(add(2, b=3).payload().data)
    assert (args, kwargs) == ((2,), {"b": 3})
