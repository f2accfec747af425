"""instance_info(): identity from COMPUTE_POOL, and node 0 of 1 outside a pool."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

import skyward as sky


@sky.compute
def identity() -> tuple[sky.InstanceInfo, str | None]:
    return sky.instance_info(), os.environ.get("COMPUTE_POOL")


def test_outside_a_pool_is_node_0_of_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPUTE_POOL", raising=False)
    info = sky.instance_info()
    assert (info.node, info.total_nodes, info.is_head) == (0, 1, True)
    assert [p.node for p in info.peers] == [0]


def test_info_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        sky.instance_info().node = 3  # type: ignore[misc]


def test_each_node_knows_its_place() -> None:
    with sky.ComputePool(nodes=3, console=False) as pool:
        results = identity() @ pool
    infos = [info for info, _ in results]
    assert [i.node for i in infos] == [0, 1, 2]
    assert [i.is_head for i in infos] == [True, False, False]
    assert {i.total_nodes for i in infos} == {3}
    assert {i.head_addr for i in infos} == {"127.0.0.1"}
    assert len({i.head_port for i in infos}) == 1 and infos[0].head_port > 0
    assert [(p.node, p.addr) for p in infos[0].peers] == [(0, "127.0.0.1"), (1, "127.0.0.1"), (2, "127.0.0.1")]
    assert {i.pool_id for i in infos} == {pool.id}
    for info, raw in results:  # read from the environment variable the pool set
        assert raw is not None and json.loads(raw)["node"] == info.node


def test_bad_compute_pool_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPUTE_POOL", "{not json")
    with pytest.raises(sky.ConfigError, match="COMPUTE_POOL"):
        sky.instance_info()
