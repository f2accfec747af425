"""A named cluster's workers on machines reached through a launcher (Slurm's ``srun``, see
:attr:`~skyward.machine.Instance.launcher`): each resident worker is a job step of its own.

A batch scheduler ends a step's processes when the step's first process exits, so the worker
cannot detach there as it does over SSH: the step is the worker (``--in-step``, it stays in the
foreground). The step's ``srun`` runs on this machine in a session of its own, so it outlives
the client, and its stdout carries one byte, written once the worker listens on its socket:
:func:`start_step` returns then, as the SSH start returns once the detached worker listens.
Everything else is as over SSH: a later client reaches the worker through a bridge started in
a new step on the node (``srun --overlap``, the transport's ``start``), and ``skyward status``
asks its control socket in another. When the worker ends by its autostop, its step runs the
provider's ``autostop_release`` command (Slurm: ``scancel`` the allocation), so an idle cluster
holds no allocation; a worker ended any other way (``skyward down`` releases the allocation
itself, a restart starts new workers in it) leaves the allocation as it is.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time

from skyward.errors import BootstrapError
from skyward.machine import Instance
from skyward.runtime.cluster import AUTOSTOPPED

__all__ = ["START_TIMEOUT", "start_step", "step_command"]

#: Seconds the step's worker has to listen (the worker's own limit is 60 s; srun's start adds).
START_TIMEOUT = 90.0


def step_command(resident: str, release: str | None) -> str:
    """The shell command of the step: the worker's ``resident`` command, then ``release`` if the
    worker ended by its autostop; the step exits as the worker did."""
    if not release:
        return resident
    return f"({resident}); code=$?; if [ $code = {AUTOSTOPPED} ]; then {release}; fi; exit $code"


def start_step(inst: Instance, command: str, sock: str, timeout: float = START_TIMEOUT) -> None:
    """Start ``command`` (see :func:`step_command`) as a step on ``inst``'s node, detached from
    this process; return once its worker listens on ``sock``. BootstrapError, the step ended,
    if it does not within ``timeout`` seconds."""
    os.makedirs(os.path.dirname(sock), mode=0o700, exist_ok=True)
    log_path = sock + ".log"  # (the worker's own log: srun's messages go beside its lines)
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        process = subprocess.Popen([*inst.launcher, "/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    said = b""
    with process.stdout:
        while not said and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
            if ready:
                said = os.read(process.stdout.fileno(), 1) or b"end"
    if said == b"!":
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # (srun killed: Slurm ends the step)
    process.wait()
    with contextlib.suppress(OSError), open(log_path, "rb") as f:
        tail = f.read()[-4000:].decode("utf-8", "replace").splitlines()[-20:]
    why = "its step ended" if said else f"it did not listen within {timeout:g}s"
    raise BootstrapError(inst.id, "starting worker", f"the cluster's worker did not start ({why})",
                         node=inst.node, log_tail=tail)
