"""How to reach a machine: run a command, copy files, start a process with a byte stream.

``local`` uses subprocesses; ``ssh`` (paramiko) is imported lazily where it is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skyward.transport.base import Channel, CommandResult, Transport, WorkerLaunch

if TYPE_CHECKING:
    from skyward.machine import Instance

__all__ = ["Channel", "CommandResult", "Transport", "WorkerLaunch", "reach"]


def reach(instance: Instance) -> Transport:
    """The transport for ``instance``: over SSH when it has an SSH address, else this machine;
    either way its workers start through the instance's ``launcher`` command, when it has one
    (run on the machine the transport reaches)."""
    if instance.ssh is not None:
        from skyward.transport import warm

        found = warm.take(instance)  # (a connection opened ahead of need: skyward.transport.warm)
        if found is not None:
            return found
        from skyward.transport.ssh import SSHTransport

        return SSHTransport.to(instance.ssh, instance.launcher)
    from skyward.transport.local import LocalTransport

    if instance.launcher:
        return LocalTransport(instance.launcher, host=instance.id)
    return LocalTransport()
