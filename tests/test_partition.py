"""One host's trouble stalls no other: with the link to one SSH host cut mid-task, that node
is named within ``idle_timeout`` plus a few seconds, the other node goes on working (its
heartbeats, writes and replies never wait on the cut one), teardown says the cut worker is
not confirmed gone (not "still running"), and the cut worker stops itself."""

from __future__ import annotations

import sys
import time
from concurrent.futures import as_completed
from pathlib import Path

import cloudpickle
import pytest

import skyward as sky
from tests.contract.conftest import Output
from tests.contract.tasks import node_of, wait_for_file
from tests.hosts.conftest_fixture import ssh_provider
from tests.test_ssh import leftovers, wait_until

# The hosts cannot import this repository's tests package: ship this module's tasks by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

IDLE_TIMEOUT = 4.0


@sky.compute
def hold_then_node(tag: str, path: str, limit: float) -> int:
    """Say it started, hold until ``path`` exists, return the node."""
    node = sky.instance_info().node
    print(f"{tag} started on {node}", flush=True)
    if not wait_for_file(path, limit):  # (no assert: pytest rewrites those, and the hosts lack pytest)
        raise TimeoutError("never released")
    return node


def test_a_cut_host_is_named_within_idle_timeout_and_the_other_node_keeps_working(
        test_hosts, wheelhouse, tmp_path: Path) -> None:
    hosts = test_hosts[:2]
    release = tmp_path / "release"  # /tmp is shared with the hosts
    provider = ssh_provider(hosts, wheelhouse)
    cut = hosts[1]
    try:
        with pytest.raises(sky.SkywardError) as teardown:
            with sky.ComputePool(provider=provider, nodes=2, console=False, idle_timeout=IDLE_TIMEOUT) as pool:
                seen = Output(pool)
                futures = [hold_then_node("held", str(release), 120) > pool for _ in range(2)]
                seen.wait_for("held started on 0")
                seen.wait_for("held started on 1")
                cut.set_link(False)
                cut_at = time.monotonic()
                done = next(as_completed(futures, timeout=IDLE_TIMEOUT + 30))
                named_after = time.monotonic() - cut_at
                with pytest.raises(sky.WorkerLost) as lost:
                    done.result()
                assert lost.value.node == 1, str(lost.value)
                assert named_after < IDLE_TIMEOUT + 4, f"node 1 named {named_after:.1f}s after the cut"
                # Node 0 was never starved of pings: it is still running its task, well past
                # idle_timeout after the cut, and answers.
                time.sleep(IDLE_TIMEOUT + 1 - min(named_after, IDLE_TIMEOUT + 1))
                release.touch()
                other = futures[1] if done is futures[0] else futures[0]
                assert other.result(timeout=10) == 0
                assert node_of() >> pool == 0  # the pool goes on with node 0
                left_at = time.monotonic()
        took = time.monotonic() - left_at
        assert took < 10, f"teardown took {took:.1f}s"
        message = str(teardown.value)
        assert "node 1: not confirmed gone" in message and "still running" not in message
        assert "node 0" not in message
        assert not leftovers(hosts[:1])
    finally:
        cut.set_link(True)
    # Cut off from its client, the worker stopped itself (its dead man's switch).
    assert wait_until(lambda: not leftovers([cut]), IDLE_TIMEOUT + 10), leftovers([cut])

