"""The contract fixtures: the same pool, by two providers.

``pool`` (shared by a module's tests, which must leave it clean) and ``new_pool`` (a factory
for tests that break workers or check teardown) are parametrized over ``local`` (worker
processes on this machine) and ``ssh`` (two real sshd test hosts in network namespaces, which
share this machine's /tmp and process ids).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

import skyward as sky
from skyward import events as ev
from tests.hosts.conftest_fixture import ssh_provider, venv_site_env

PROVIDERS = ("local", "ssh")
NODES = 2


def _factory(request: pytest.FixtureRequest) -> Callable[..., sky.ComputePool]:
    """Makes a pool of this provider; ``ssh={...}`` are options for the SSH provider alone."""
    if request.param == "local":
        return lambda ssh=None, **kw: sky.ComputePool(**{"nodes": NODES, "console": False, **kw})
    hosts = request.getfixturevalue("test_hosts")[:NODES]
    wheelhouse = request.getfixturevalue("wheelhouse")

    def make(ssh: dict | None = None, **kw) -> sky.ComputePool:
        # numpy comes from the hosts' own Python (the wheelhouse has only skyward's dependencies)
        provider = ssh_provider(hosts, wheelhouse, system_site_packages=["numpy"], **(ssh or {}))
        image = kw.pop("image", sky.Image())
        extra = venv_site_env("numpy")  # pytest in a fresh venv: numpy is there, not in the base
        return sky.ComputePool(provider=provider, nodes=NODES, console=False,
                               image=image.with_env(**extra) if extra else image, **kw)

    return make


@pytest.fixture(scope="module", params=PROVIDERS)
def pool(request: pytest.FixtureRequest) -> Iterator[sky.ComputePool]:
    """A 2-node pool shared by the tests of one module (tests must leave it clean)."""
    with _factory(request)() as shared:
        yield shared


@pytest.fixture(params=PROVIDERS)
def new_pool(request: pytest.FixtureRequest) -> Callable[..., sky.ComputePool]:
    """Makes a fresh 2-node pool (enter it with ``with``): for tests that break or close one."""
    return _factory(request)


@pytest.fixture
def tag() -> str:
    """A word no other test prints: tells this test's output lines and files from others'."""
    return uuid.uuid4().hex[:10]


class Output:
    """The task output lines a pool emits (``TaskOutput`` events) from now on."""

    def __init__(self, pool: sky.ComputePool) -> None:
        self.events: list[ev.TaskOutput] = []
        self._changed = threading.Condition()
        self.close = pool.subscribe(self._on_event)

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()

    def snapshot(self) -> list[ev.TaskOutput]:
        """Every output event so far."""
        with self._changed:
            return list(self.events)

    def lines(self, containing: str, stream: str = "stdout") -> list[tuple[int, str]]:
        """``(node, line)`` of every line of ``stream`` that contains ``containing``, in arrival order."""
        with self._changed:
            return [(e.node, e.line) for e in self.events if e.stream == stream and containing in e.line]

    def wait_for(self, prefix: str, timeout: float = 30.0) -> ev.TaskOutput:
        """The first line that starts with ``prefix``, waiting up to ``timeout`` seconds for it."""
        def find() -> ev.TaskOutput | None:
            return next((e for e in self.events if e.line.startswith(prefix)), None)

        with self._changed:
            found = self._changed.wait_for(find, timeout)
        assert found is not None, f"no output line starting with {prefix!r} within {timeout:g}s"
        return found


@pytest.fixture
def output(pool: sky.ComputePool) -> Iterator[Output]:
    """The shared pool's output lines during this test."""
    seen = Output(pool)
    yield seen
    seen.close()


def provider_of(request: pytest.FixtureRequest) -> str:
    params = request.node.callspec.params
    return params.get("pool") or params["new_pool"]


def xfail_on(request: pytest.FixtureRequest, providers: tuple[str, ...], reason: str) -> None:
    """Mark this test an expected failure (strict: it must fail) on ``providers`` only."""
    if provider_of(request) in providers:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
