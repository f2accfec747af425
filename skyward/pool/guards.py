"""What the pool does at its edges: the signals that must end a pool's block cleanly, the one
line Ctrl-C leaves, a plugin's client-side hook that fails, and the errors for operators
written the wrong way round (``pool >> f(x)``, ``f >> pool``)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from skyward import _signals
from skyward.compute import ComputeFunction
from skyward.errors import ConfigError, PluginError, SkywardError
from skyward.plugins._base import Plugin

__all__ = ["install_exit_signals", "not_pending", "plugin_hook", "quiet_interrupt", "restore_exit_signals",
           "swapped"]


def install_exit_signals() -> list[Callable[[], None]]:
    """SIGTERM would end the process without running finally blocks; turn it into an exception
    so the with-block's teardown runs (only if nobody else installed a handler). Both it and
    Ctrl-C's handler are guarded so that they never interrupt the main thread in the middle of
    a frame (skyward._signals). Main thread only; returns what puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return []

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    term = on_sigterm if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else None
    return [_signals.install(signal.SIGTERM, term), _signals.install(signal.SIGINT)]


def restore_exit_signals(restore: list[Callable[[], None]]) -> None:
    if threading.current_thread() is threading.main_thread():
        for undo in reversed(restore):
            undo()


def swapped(op: str, other: Any) -> ConfigError:
    from skyward.compute import _describe

    return ConfigError(f"left-hand side of {op}", f"a pending computation, with the pool on the right: "
                       f"`f(...) {op} pool`", "a ComputePool",
                       detail=f"the operands are swapped; the right-hand side was {_describe(other)}")


def not_pending(op: str, other: Any) -> ConfigError:
    from skyward.compute import PendingGather, _describe

    if isinstance(other, ComputeFunction):
        detail = f"call the function first: {other.options.name}(...) {op} pool"
    elif isinstance(other, PendingGather):
        detail = "a gather runs with >>: `sky.gather(...) >> pool` or `(p1 & p2) >> pool`"
    elif callable(other):
        detail = f"did you forget @sky.compute on {getattr(other, '__name__', 'the function')}?"
    else:
        detail = "did you forget @sky.compute? Without it the function ran here, now, and this is its result"
    accepted = f"a pending computation (a call of a @sky.compute function), e.g. f(x) {op} pool"
    return ConfigError(f"left-hand side of {op}", accepted, _describe(other), detail=detail)


@contextlib.contextmanager
def plugin_hook(plugin: Plugin, hook: str) -> Iterator[None]:
    """Name the plugin when one of its client-side hooks fails (bad input stays a ConfigError)."""
    try:
        yield
    except SkywardError:
        raise
    except Exception as exc:
        import traceback

        raise PluginError(plugin.name, None, hook, f"{type(exc).__name__}: {exc}", traceback.format_exc()) from exc


_hook_installed = False


def quiet_interrupt(exc: BaseException | None) -> None:
    """After a pool stopped for Ctrl-C and said so in one line, Python's own report of the
    KeyboardInterrupt (a traceback through the pool's internals) is left out.

    Only a KeyboardInterrupt that passed through a pool's teardown is affected, and only when
    nobody catches it; the process still exits as one interrupted by SIGINT (status 130).
    """
    global _hook_installed
    if not isinstance(exc, KeyboardInterrupt):
        return
    with contextlib.suppress(AttributeError, TypeError):
        exc._skyward_reported = True  # type: ignore[attr-defined]
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if isinstance(value, KeyboardInterrupt) and getattr(value, "_skyward_reported", False):
            return
        previous(kind, value, tb)

    sys.excepthook = excepthook
