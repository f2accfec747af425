"""Session-scoped pytest fixture ``test_hosts``: SSH test hosts (see testhosts.py).

Import it into a conftest.py::

    from tests.hosts.conftest_fixture import test_hosts  # noqa: F401

A test that takes ``test_hosts`` gets a list of ``TEST_HOSTS_N`` (default 2)
:class:`tests.hosts.testhosts.TestHost`, each a real sshd in its own network
namespace with a private home and work dir.  The fixture skips only when the
machine cannot make them at all (not root, no ``ip netns``); anything else
that goes wrong (sshd missing, a start failure) is an error.  Each pytest
process takes its own slot (prefix ``skypK``, subnet ``10.213.(100+K).0/24``),
so concurrent sessions on one machine don't disturb each other; leftovers of
a crashed session in that slot are cleared before starting, and everything is
torn down at the end of the session even if tests fail.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.hosts import testhosts

DEFAULT_N = 2


@pytest.fixture(scope="session")
def test_hosts() -> Iterator[list[testhosts.TestHost]]:
    reason = testhosts.unavailable_reason()
    if reason:
        pytest.skip(reason)
    n = int(os.environ.get("TEST_HOSTS_N", DEFAULT_N))
    with testhosts.claim_slot() as slot:
        testhosts.down(prefix=slot.prefix)  # leftovers of a crashed session
        try:
            yield testhosts.up(n, prefix=slot.prefix, subnet=slot.subnet)
        finally:
            testhosts.down(prefix=slot.prefix)
