"""Accounts and QOS on a real Slurm with its accounting database (tests/slurm_cluster.py:
MariaDB and slurmdbd of the cluster's own, enforcing associations): an account or QOS the user
has no association with is refused at submission, naming the value and the accepted ones.

After every test Slurm runs no job of ours and no worker is left on any node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import skyward as sky
from tests import slurm_cluster

pytestmark = slurm_cluster.needs_accounting
nothing_left = slurm_cluster.nothing_left  # (the shared after-test check)


@pytest.fixture(scope="module")
def slurm(test_hosts) -> Iterator[slurm_cluster.SlurmCluster]:
    """This file's cluster: the shared one, with accounting."""
    with slurm_cluster.serving(test_hosts, accounting=True) as cluster:
        yield cluster


@sky.compute
def job() -> str:
    import os

    return os.environ["SLURM_JOB_ID"]


def test_an_account_and_qos_the_user_has_run_the_pool(slurm) -> None:
    with sky.ComputePool(provider=sky.Slurm(account="teaching", qos="high"), nodes=1, console=False) as pool:
        [ran_in] = job() @ pool
        assert slurm.run("squeue", "-h", "-o", "%i %a %q").stdout.split() == [ran_in, "teaching", "high"]


@pytest.mark.parametrize("parameter", ["account", "qos"])
def test_an_unknown_account_or_qos_is_refused_naming_it_and_the_accepted_ones(slurm, parameter) -> None:
    with pytest.raises(sky.ConfigError) as caught:
        with sky.ComputePool(provider=sky.Slurm(**{parameter: "nope"}), nodes=1, console=False):
            pass
    assert caught.value.parameter == parameter and caught.value.got == "nope"
    for name in slurm_cluster.ACCOUNTS if parameter == "account" else slurm_cluster.QOS:
        assert name in caught.value.accepted
    assert "Slurm said" in str(caught.value)
    assert slurm.jobs() == []  # (nothing was queued)
