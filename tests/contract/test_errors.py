"""A task's exception reaches the client with its type, its fields and its remote traceback."""

from __future__ import annotations

import sys
import threading

import cloudpickle
import pytest

import skyward as sky
from tests.contract.tasks import echo

# QuotaExceeded must travel like a class of a user's script (the SSH hosts cannot import
# this repository's tests package).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class QuotaExceeded(Exception):
    def __init__(self, quota: int) -> None:
        super().__init__(quota)  # args are what pickle rebuilds the exception from
        self.quota = quota

    def __str__(self) -> str:
        return f"quota {self.quota} exceeded"


@sky.compute
def check_value(x: int) -> int:
    if x > 10:
        raise ValueError(f"value {x} is too large")
    return x


@sky.compute
def use_quota(quota: int) -> None:
    raise QuotaExceeded(quota)


@sky.compute
def fails_on_node(failing: int) -> int:
    node = sky.instance_info().node
    if node == failing:
        raise ValueError(f"node {node} refuses")
    return node


@sky.compute
def returns_a_lock() -> object:
    return threading.Lock()


def test_a_remote_value_error_is_raised_as_value_error_with_its_remote_traceback(pool: sky.ComputePool) -> None:
    with pytest.raises(ValueError) as info:
        check_value(42) >> pool
    assert str(info.value) == "value 42 is too large"
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "remote traceback" in notes
    assert ", in check_value" in notes and 'raise ValueError(f"value {x} is too large")' in notes
    assert check_value(3) >> pool == 3


def test_an_exception_class_of_the_users_code_is_rebuilt_with_its_fields(pool: sky.ComputePool) -> None:
    with pytest.raises(QuotaExceeded) as info:
        use_quota(7) >> pool
    assert str(info.value) == "quota 7 exceeded"
    assert type(info.value) is QuotaExceeded
    assert info.value.quota == 7
    assert "raise QuotaExceeded(quota)" in "\n".join(getattr(info.value, "__notes__", []))


def test_a_failing_broadcast_raises_the_error_of_the_node_that_failed(pool: sky.ComputePool) -> None:
    with pytest.raises(ValueError) as info:
        fails_on_node(1) @ pool
    assert str(info.value) == "node 1 refuses"
    assert getattr(info.value, "node", None) == 1
    assert fails_on_node(-1) @ pool == [0, 1]


def test_an_unpicklable_result_is_a_serialization_error_naming_the_return_value(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.SerializationError, match="return value") as info:
        returns_a_lock() >> pool
    assert "lock" in str(info.value)
    assert echo("still usable") >> pool == "still usable"


@sky.compute
def exits(message: str) -> None:
    sys.exit(message)


@sky.compute
def raises_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("raised by the task")


def test_sys_exit_in_a_task_is_a_remote_error_carrying_system_exit_and_its_message(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.RemoteError) as info:
        exits("the task gives up") >> pool
    assert info.value.type_name == "builtins.SystemExit"
    assert info.value.message == "the task gives up"
    assert "sys.exit(message)" in info.value.traceback
    with pytest.raises(sky.RemoteError, match="SystemExit: the task gives up on node"):
        exits("the task gives up") @ pool
    assert echo(1) >> pool == 1  # the client and the pool go on


def test_a_keyboard_interrupt_raised_by_a_task_is_not_taken_for_the_users_ctrl_c(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.RemoteError) as info:
        raises_keyboard_interrupt() >> pool
    assert not isinstance(info.value, KeyboardInterrupt)
    assert info.value.type_name == "builtins.KeyboardInterrupt"
    assert info.value.message == "raised by the task"
    assert echo(2) >> pool == 2
