"""``Instance`` values outlive the code that wrote them: a named cluster's record keeps them
pickled in its state database."""

from __future__ import annotations

import pickle

from skyward.machine import Instance


def test_an_instance_pickles_whole() -> None:
    machine = Instance("i-1", 0, "10.0.0.1", spot=True, price_per_hour=0.5)
    assert pickle.loads(pickle.dumps(machine)) == machine


def test_an_instance_written_before_a_field_was_added_takes_its_default() -> None:
    machine = Instance("i-1", 0, "10.0.0.1", spot=True, price_per_hour=0.5)
    # what a record written before `price_per_hour` (and `launcher`) holds: all but the last two
    state = machine.__getstate__()[:-2]
    restored = Instance.__new__(Instance)
    restored.__setstate__(state)
    assert restored.price_per_hour is None and restored.spot is True and restored.private_addr == "10.0.0.1"
    assert restored.launcher == ()
