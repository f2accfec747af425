"""Run by tests/test_venv_hosts.py with the interpreter of a virtual environment (not collected
by the suite itself): test hosts made from that interpreter give a pool the packages that
environment has, when the pool asks for the host Python's packages."""

from __future__ import annotations

import os
import sys

import skyward as sky
from tests.hosts.conftest_fixture import ssh_provider

PROBE = os.environ["SKYWARD_VENV_PROBE"]  # a package only the virtual environment has


def test_a_host_python_in_a_venv_lends_its_own_packages(test_hosts, wheelhouse) -> None:
    assert sys.prefix != sys.base_prefix, "run me with a virtual environment's interpreter"

    @sky.compute
    def where(name: str) -> str:
        import importlib

        return importlib.import_module(name).__file__

    provider = ssh_provider(test_hosts[:1], wheelhouse, system_site_packages=[PROBE])
    with sky.ComputePool(provider=provider, nodes=1, console=False) as pool:
        assert (where(PROBE) >> pool).startswith(sys.prefix)
