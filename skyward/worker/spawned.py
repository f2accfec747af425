"""A spawned call's process on its node: ``python -m skyward.worker.spawned CALL RESULT
[PLUGINS broadcast|head]``.

The command of a job that ``pool.spawn`` put in a cluster's queue (:mod:`skyward.runtime.spawned`
says where its files are and what is kept). It loads the pickled call and deletes its file, runs
it, and keeps what came of it in RESULT: the value, or the exception (type, message, traceback)
as a :class:`~skyward.messages.RemoteFailure`, which the client rebuilds as it rebuilds a
task's. A value that cannot be pickled, or whose pickle is over the limit, is kept as an error
saying so. Exit 0 when it kept a value, 1 otherwise (the job is then FAILED in the queue); the
traceback also goes to the job's log.

With PLUGINS (the pool's plugins, pickled), the call runs inside their ``around_app`` hooks and
wrapped by their ``around_task`` hooks, as a task of the pool's workers does, seen as
:func:`call_info` says: a broadcast call on a torch pool thus runs in a process group of its own
(one rank per node), formed again on every run of the job (a managed job's recovery included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import sys
import traceback
from typing import Any

from skyward.errors import SerializationError
from skyward.job_errors import JobError
from skyward.messages import RemoteFailure
from skyward.protocol import dumps_by_value
from skyward.runtime import instance as runtime_instance
from skyward.runtime.spawned import RESULT_LIMIT

#: A spawned call's plugins meet (torch's rendezvous) on ``head_port + PORT_OFFSET + job %
#: PORTS``: off the port the pool's workers' own group holds (``head_port``) and jax's
#: (``head_port + 1``), and apart for calls of nearby ids that run at once. The Local provider
#: keeps ``head_port`` and the seven ports above it free.
PORT_OFFSET, PORTS = 2, 6


def _where() -> tuple[str, int]:
    """This job's cluster and id (from the variables every job gets)."""
    info = json.loads(os.environ.get("SKYWARD_CLUSTER_INFO") or "{}")
    return str(info.get("cluster_name") or "?"), int(os.environ.get("SKYWARD_JOB_ID") or 0)


def _failure(exc: BaseException) -> bytes:
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    return dumps_by_value(("error", RemoteFailure.of(exc)))


def call_info(info: runtime_instance.InstanceInfo, job: int, broadcast: bool) -> runtime_instance.InstanceInfo:
    """The pool as spawned job ``job``'s plugins (and its ``sky.instance_info()``) see it: one
    process per node (a job runs once per node), every node for a ``broadcast`` call, else the
    head alone (a group of one, which the torch plugin leaves uninitialised), and a rendezvous
    port of its own (:data:`PORT_OFFSET`)."""
    peers = info.peers if broadcast else tuple(p for p in info.peers if p.node == 0)
    return dataclasses.replace(info, total_nodes=info.total_nodes if broadcast else 1, peers=peers, local_rank=0,
                               processes_per_node=1, head_port=info.head_port + PORT_OFFSET + job % PORTS)


def outcome(call: bytes, hooks: bytes = b"", broadcast: bool = False) -> tuple[bytes, bool]:
    """Run the pickled call (inside the hooks of ``hooks``, pickled plugins); the pickle to keep,
    and whether it holds a value."""
    from skyward.plugins._base import wrap_task

    try:
        plugins = tuple(pickle.loads(hooks)) if hooks else ()
        with contextlib.ExitStack() as app:
            if plugins:
                info = call_info(runtime_instance.instance_info(), _where()[1], broadcast)
                os.environ[runtime_instance.ENV_VAR] = info.to_json()
                for plugin in plugins:
                    if plugin.around_app is not None:
                        app.enter_context(plugin.around_app(info))
            pending = pickle.loads(call)
            value: Any = wrap_task(plugins, pending.fn)(*pending.args, **pending.kwargs)
    except BaseException as exc:  # (kept for the client, SystemExit and KeyboardInterrupt too)
        return _failure(exc), False
    try:
        kept = dumps_by_value(("ok", value))
    except Exception as exc:
        error = SerializationError("the call's result", "a picklable value", type(value).__name__,
                                   detail=f"{type(exc).__name__}: {exc}")
        return _failure(error), False
    if len(kept) > RESULT_LIMIT:
        cluster, job = _where()
        return _failure(JobError(cluster, job, f"its result takes {len(kept) / 2**20:.1f} MiB, more than the "
                                 f"{RESULT_LIMIT // 2**20} MiB a job's result may keep",
                                 way_out="return something smaller (a path, a location in storage)")), False
    return kept, True


def main(argv: list[str]) -> int:
    call, result, *hooks = argv
    with open(call, "rb") as f:
        data = f.read()
    os.unlink(call)
    plugins = b""
    if hooks:
        with open(hooks[0], "rb") as f:
            plugins = f.read()
        os.unlink(hooks[0])
    kept, ok = outcome(data, plugins, hooks[1:] == ["broadcast"])
    sys.stdout.flush()
    partial = result + ".part"
    fd = os.open(partial, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(kept)
    os.replace(partial, result)  # (the client never reads half a result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
