"""How to reach a machine: run a command, copy files, start a process with a byte stream.

``local`` uses subprocesses; ``ssh`` (paramiko) is imported lazily where it is needed.
"""

from skyward.transport.base import Channel, CommandResult, Transport, WorkerLaunch

__all__ = ["Channel", "CommandResult", "Transport", "WorkerLaunch"]
