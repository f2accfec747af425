"""A spawned call's process on its node: ``python -m skyward.worker.spawned CALL RESULT``.

The command of a job that ``pool.spawn`` put in a cluster's queue (:mod:`skyward.runtime.spawned`
says where its files are and what is kept). It loads the pickled call and deletes its file, runs
it, and keeps what came of it in RESULT: the value, or the exception (type, message, traceback)
as a :class:`~skyward.messages.RemoteFailure`, which the client rebuilds as it rebuilds a
task's. A value that cannot be pickled, or whose pickle is over the limit, is kept as an error
saying so. Exit 0 when it kept a value, 1 otherwise (the job is then FAILED in the queue); the
traceback also goes to the job's log.
"""

from __future__ import annotations

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
from skyward.runtime.spawned import RESULT_LIMIT


def _where() -> tuple[str, int]:
    """This job's cluster and id (from the variables every job gets)."""
    info = json.loads(os.environ.get("SKYWARD_CLUSTER_INFO") or "{}")
    return str(info.get("cluster_name") or "?"), int(os.environ.get("SKYWARD_JOB_ID") or 0)


def _failure(exc: BaseException) -> bytes:
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    return dumps_by_value(("error", RemoteFailure.of(exc)))


def outcome(call: bytes) -> tuple[bytes, bool]:
    """Run the pickled call; the pickle to keep, and whether it holds a value."""
    try:
        pending = pickle.loads(call)
        value: Any = pending.fn(*pending.args, **pending.kwargs)
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
    call, result = argv
    with open(call, "rb") as f:
        data = f.read()
    os.unlink(call)
    kept, ok = outcome(data)
    sys.stdout.flush()
    partial = result + ".part"
    fd = os.open(partial, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(kept)
    os.replace(partial, result)  # (the client never reads half a result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
