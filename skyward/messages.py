"""The protocol's structured messages, as frozen dataclasses.

Frames on the hot path (TASK, RESULT, OUTPUT, HEARTBEAT...) stay small tuples: their layouts
are listed, all in one place, on :class:`skyward.protocol.Kind`. The messages that carry
structure travel as these values in the frame's control part (client and worker run the same
skyward, so they unpickle on either side):

* :class:`Setup`: client -> worker, the first frame: who the worker is and how it runs tasks.
* :class:`Fatal`: worker -> client instead of READY: a plugin's ``around_app`` failed.
* :class:`RemoteFailure`: in an ERROR frame, a task's exception, encoded on the worker and
  rebuilt on the client as its own type when possible (else :class:`~skyward.RemoteError`,
  and always for what is not an ``Exception``: ``SystemExit``, ``KeyboardInterrupt``...).
"""

from __future__ import annotations

import pickle
import traceback as tb_module
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from skyward.runtime.instance import InstanceInfo
from skyward.errors import PluginError, RemoteError
from skyward.protocol import dumps_by_value

__all__ = ["Fatal", "RemoteFailure", "Setup"]

#: How the rebuilt exception's note starts (``remote traceback (node 1):``).
NOTE_PREFIX = "remote traceback"


@dataclass(frozen=True, slots=True)
class Setup:
    """Everything a worker is told before it starts (the plugins follow as the frame's payload)."""

    info: InstanceInfo
    env: Mapping[str, str]  # exported before the plugins start
    concurrency: int  # tasks run at once
    executor: Literal["thread", "process"]
    idle_timeout: float  # seconds without a word from the client before the worker exits
    heartbeat_interval: float
    spin: float = 0.0  # seconds the reader polls before it blocks (see protocol.spinner)
    shutdown_grace: float = 3.0  # seconds running tasks get to stop at shutdown
    #: (a named cluster's worker) seconds with no client attached before it ends; None: never.
    autostop: float | None = None
    #: A spot machine: watch the instance metadata for preemption notices (worker.preemption).
    watch_preemption: bool = False


@dataclass(frozen=True, slots=True)
class Fatal:
    """A worker could not start: ``plugin``'s ``hook`` raised on ``node``."""

    plugin: str
    hook: str
    node: int
    message: str
    traceback: str

    def error(self) -> PluginError:
        return PluginError(self.plugin, self.node, self.hook, self.message, self.traceback)


@dataclass(frozen=True, slots=True)
class RemoteFailure:
    """A task's exception on its way to the client: type name, message, traceback text, and the
    exception itself pickled when that pickle can be loaded again (None otherwise)."""

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None = None

    @classmethod
    def of(cls, exc: BaseException) -> RemoteFailure:
        kind = type(exc)
        text = "".join(tb_module.format_exception(exc))
        pickled: bytes | None
        try:
            pickled = dumps_by_value(exc)
            pickle.loads(pickled)  # a type whose pickle can't be loaded even here is no better
        except Exception:
            pickled = None
        try:
            message = str(exc)
        except Exception:
            message = f"<unprintable {kind.__name__}>"
        return cls(f"{kind.__module__}.{kind.__qualname__}", message, text, pickled)

    def rebuild(self, node: int | None) -> BaseException:
        """The remote exception, with the remote traceback attached as a note.

        The rebuilt exception also carries ``remote_traceback`` and ``node`` attributes when it
        accepts them. Falls back to :class:`RemoteError` when the type cannot be rebuilt here.
        """
        exc: BaseException | None = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:
                exc = None
        if not isinstance(exc, Exception):
            # Not rebuilt either: a SystemExit (sys.exit in a task) would end the client's
            # program, and a KeyboardInterrupt would pass for the user's own Ctrl-C. Such an
            # exit of the task is an error of the task, carried with its type and message.
            return RemoteError(self.type_name, self.message, self.traceback, node=node)
        where = f" (node {node})" if node is not None else ""
        try:
            exc.add_note(f"{NOTE_PREFIX}{where}:\n{self.traceback.rstrip()}")
        except Exception:
            pass
        for attr, value in (("remote_traceback", self.traceback), ("node", node)):
            if not hasattr(exc, attr):
                try:
                    setattr(exc, attr, value)
                except Exception:
                    pass
        return exc
