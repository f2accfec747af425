"""Every error Skyward raises, under one root.

::

    SkywardError
    ├── ConfigError            bad input, raised before anything is provisioned
    │   └── SerializationError an argument or result that cannot be pickled
    ├── MissingDependency      an optional package is not installed (also an ImportError)
    ├── ClusterError           a named cluster cannot be used as asked
    │   └── ClusterBusy        another client holds the cluster
    ├── JobError               a cluster job cannot be found, cancelled or collected as asked
    │   ├── JobFailed          a job ended without a result: a command's non-zero exit
    │   └── JobTimeout         a job did not finish within ``result(timeout=...)`` (it goes on)
    │                          (these three in :mod:`skyward.job_errors`)
    ├── ProvisionError         a machine could not be acquired
    │   └── CapacityError      the provider had no capacity / quota for the request
    ├── BootstrapError         preparing a machine or starting its worker failed
    ├── CommandFailed          a shell command (sky.shell) exited non-zero or was killed
    ├── FileMountError         a file_mounts bucket could not be copied, mounted or unmounted on a node
    ├── PluginError            a plugin hook failed on a node
    ├── ConnectionLost         the byte stream to a worker broke
    │   └── WorkerLost         the worker process died or went silent
    ├── RemoteError            a task raised an exception that cannot be rebuilt here
    ├── TaskCancelled          a task was stopped before it finished
    ├── DeviceError            an operation on a remote ``sky`` torch device failed
    └── TaskTimeout            a task ran past its ``timeout``

Each error keeps its data as attributes (``node``, ``host``, ``step``, ``exit_code``,
``log_tail``...) and builds its message from them, so callers can branch on fields instead
of parsing text. Errors from libraries underneath (paramiko, botocore) are translated at the
boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BootstrapError",
    "CapacityError",
    "ClusterBusy",
    "ClusterError",
    "CommandFailed",
    "ConfigError",
    "ConnectionLost",
    "FileMountError",
    "MissingDependency",
    "PluginError",
    "ProvisionError",
    "RemoteError",
    "SerializationError",
    "SkywardError",
    "TaskCancelled",
    "TaskTimeout",
    "WorkerLost",
]


def _tail(lines: Sequence[str], limit: int = 20) -> str:
    shown = list(lines)[-limit:]
    return "\n".join("    " + line for line in shown)


def _readable(line: str) -> str:
    """A bootstrap log line as users read it: the script's step markers become ``step NAME``."""
    if line.startswith("::step:: "):
        return "step " + line[len("::step:: "):].strip()
    if line.startswith("::warm::"):
        return line[len("::warm::"):].strip() or "environment reused"
    return line


def _exit_text(code: int) -> str:
    """"exit code 3", or for a process killed by a signal (a negative code) "killed by SIGKILL"."""
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


class SkywardError(Exception):
    """Root of every error Skyward raises."""


class MissingDependency(SkywardError, ImportError):
    """An optional package a feature needs is not installed.

    ``package`` is the missing import, ``feature`` what needed it, ``extra`` the Skyward extra
    that installs it; the message is the ``pip install`` line to run.
    """

    def __init__(self, package: str, feature: str, extra: str):
        self.package = package
        self.feature = feature
        self.extra = extra
        super().__init__(
            f"{feature} needs {package}, which is not installed: pip install 'skyward[{extra}]'",
            name=package,
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.package, self.feature, self.extra))


class ConfigError(SkywardError, ValueError):
    """Invalid user input, detected before any machine or worker is started.

    ``parameter`` names what was wrong and ``accepted`` says what would have been accepted.
    """

    def __init__(self, parameter: str, accepted: str, got: object = None, *, detail: str = ""):
        self.parameter = parameter
        self.accepted = accepted
        self.got = got
        self.detail = detail
        msg = f"invalid {parameter}: expected {accepted}, got {got!r}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def __reduce__(self):  # keyword-only fields survive pickling
        return (_rebuild_config_error, (type(self), self.parameter, self.accepted, self.got, self.detail))


def _rebuild_config_error(cls, parameter, accepted, got, detail):
    return cls(parameter, accepted, got, detail=detail)


class SerializationError(ConfigError, TypeError):
    """An argument (or a result) could not be pickled for transfer."""

    def __init__(self, parameter: str, accepted: str = "a picklable value", got: object = None, *, detail: str = ""):
        super().__init__(parameter, accepted, got, detail=detail)


class ClusterError(SkywardError):
    """A named cluster cannot be used as asked: none by that name, or one of another shape.

    ``name`` is the cluster; ``field``, ``wanted`` and ``have`` say what disagrees (None when
    the cluster is simply missing); the message ends with the way out."""

    def __init__(self, name: str, problem: str, *, field: str | None = None, wanted: object = None,
                 have: object = None, way_out: str = ""):
        self.name = name
        self.problem = problem
        self.field = field
        self.wanted = wanted
        self.have = have
        self.way_out = way_out
        super().__init__(f"cluster {name!r}: {problem}" + (f"; {way_out}" if way_out else ""))

    def __reduce__(self):  # keyword-only fields survive pickling
        return (_rebuild_cluster_error, (type(self), self.name, self.problem, self.field, self.wanted, self.have,
                                         self.way_out))


def _rebuild_cluster_error(cls, name, problem, field, wanted, have, way_out):
    error = ClusterError.__new__(cls)
    ClusterError.__init__(error, name, problem, field=field, wanted=wanted, have=have, way_out=way_out)
    return error


class ClusterBusy(ClusterError):
    """Another client (``pid`` on ``host``) is attached to the cluster, or launching it."""

    def __init__(self, name: str, pid: int | None, host: str | None):
        holder = f"pid {pid} on {host}" if pid is not None else "another process"
        super().__init__(name, f"in use by {holder} (one client at a time)",
                         way_out="wait for it to finish, or stop that process")
        self.pid = pid
        self.host = host

    def __reduce__(self):
        return (type(self), (self.name, self.pid, self.host))


class ProvisionError(SkywardError):
    """A provider could not acquire the machines asked for (``code``: the provider's error code)."""

    def __init__(self, message: str, *, provider: str = "", instance_type: str = "", zone: str = "", code: str = ""):
        self.provider = provider
        self.instance_type = instance_type
        self.zone = zone
        #: The provider's own error code (e.g. AWS's ``InsufficientInstanceCapacity``), if any.
        self.code = code
        where = ", ".join(x for x in (provider, instance_type, zone) if x)
        super().__init__(f"{message} [{where}]" if where else message)


class CapacityError(ProvisionError):
    """The provider refused for lack of capacity or quota."""


class BootstrapError(SkywardError):
    """Preparing a machine (environment build, worker start) failed on ``host`` at ``step``."""

    def __init__(self, host: str, step: str, message: str, *, exit_code: int | None = None,
                 log_tail: Sequence[str] = (), node: int | None = None, permanent: bool = False):
        self.host = host
        self.step = step
        #: Trying again cannot help (a host key that does not match): not retried.
        self.permanent = permanent
        self.exit_code = exit_code
        self.log_tail = list(log_tail)
        self.node = node
        who = f"node {node} ({host})" if node is not None else host
        msg = f"{who}: {step} failed: {message}"
        if exit_code is not None:
            msg += f" (exit code {exit_code})"
        if self.log_tail:
            msg += "\n  last output:\n" + _tail([_readable(line) for line in self.log_tail])
        super().__init__(msg)


class PluginError(SkywardError):
    """A plugin hook raised: on a node while its worker was starting, or on the client."""

    def __init__(self, plugin: str, node: int | None, hook: str, message: str, traceback: str = ""):
        self.plugin = plugin
        self.node = node  # None for the client-side hooks (transform, around_client)
        self.hook = hook
        self.traceback = traceback
        where = f"on node {node}" if node is not None else "on the client"
        text = f"plugin {plugin!r} failed in {hook} {where}: {message}"
        if traceback:
            text += "\n  remote traceback:\n" + _tail(traceback.rstrip().splitlines(), 40)
        super().__init__(text)


class ConnectionLost(SkywardError):
    """The byte stream to a worker broke."""

    def __init__(self, node: int, reason: str, *, exit_code: int | None = None, log_tail: Sequence[str] = (),
                 local_rank: int | None = None):
        self.node = node
        self.local_rank = local_rank  # which of the node's worker processes, when it has several
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = list(log_tail)
        msg = f"node {node}" + (f" (local rank {local_rank})" if local_rank is not None else "") + f": {reason}"
        if exit_code is not None:
            msg += f" ({_exit_text(exit_code)})"
        if self.log_tail:
            msg += "\n  last output:\n" + _tail(self.log_tail)
        super().__init__(msg)


class WorkerLost(ConnectionLost):
    """A worker process died or stopped answering heartbeats while it had work."""


class SlurmTimeLimit(SkywardError):
    """A Slurm pool's allocation (job ``job``) reached its time limit ``limit`` (as Slurm shows it,
    ``"01:00:00"``) and Slurm ended its workers; ``node``: the pool's node that saw it. Not a lost
    node: never replaced nor retried (a new allocation would outrun the limit asked for)."""

    def __init__(self, job: str, limit: str, node: int | None = None):
        self.job, self.limit, self.node = job, limit, node
        super().__init__(f"Slurm job {job} reached its time limit ({limit}) and Slurm ended its workers"
                         + (f" (seen on node {node})" if node is not None else "")
                         + ": ask for a longer sky.Slurm(time=...), within the partition's MaxTime")

    def __reduce__(self):
        return (type(self), (self.job, self.limit, self.node))


class RemoteError(SkywardError):
    """A task raised an exception whose type cannot be rebuilt on the client, or ended by an
    exception that is not an ``Exception``: ``sys.exit("msg")`` in a task is a RemoteError with
    ``type_name == "builtins.SystemExit"`` and ``message == "msg"`` (never the client's own
    exit), a KeyboardInterrupt raised by a task one with ``"builtins.KeyboardInterrupt"``
    (never taken for the user's Ctrl-C)."""

    def __init__(self, type_name: str, message: str, traceback: str, *, node: int | None = None):
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.node = node
        where = f" on node {node}" if node is not None else ""
        super().__init__(f"{type_name}: {message}{where}\n  remote traceback:\n" + _tail(traceback.rstrip().splitlines(), 60))

    def __reduce__(self):
        return (_rebuild_remote_error, (self.type_name, self.message, self.traceback, self.node))


def _rebuild_remote_error(type_name, message, traceback, node):
    return RemoteError(type_name, message, traceback, node=node)


class DeviceError(SkywardError):
    """An operation on a remote ``sky`` torch device (:mod:`skyward.torch`) failed, or the
    device asked for is not there. ``op`` names the aten operation (``"aten.mm.default"``),
    ``device`` the node's real device; the node's traceback is in the message."""

    def __init__(self, message: str, *, op: str = "", device: str = "", node: int | None = None):
        self.op = op
        self.device = device
        self.node = node
        super().__init__(message)

    def __reduce__(self):
        return (_rebuild_device_error, (self.args[0], self.op, self.device, self.node))


def _rebuild_device_error(message, op, device, node):
    return DeviceError(message, op=op, device=device, node=node)


class TaskTimeout(SkywardError, TimeoutError):
    """A task did not finish within its ``timeout`` (seconds)."""

    def __init__(self, task: str, timeout: float, *, node: int | None = None):
        self.task = task
        self.timeout = timeout
        self.node = node
        where = f" on node {node}" if node is not None else ""
        super().__init__(f"task {task!r} did not finish within {timeout:g}s{where}")


class TaskCancelled(SkywardError):
    """A task was stopped on its worker before it finished: the pool was closing, another node
    of the same broadcast failed, or it was cancelled.

    The one type a stopped task raises on the client. On the worker the task's thread is
    stopped with a BaseException private to the worker (``skyward.worker.executors.StopTask``),
    so that the task's own ``except Exception`` cannot swallow the stop."""

    def __init__(self, task: str = "", reason: str = "stopped before it finished", *, node: int | None = None):
        self.task = task
        self.reason = reason
        self.node = node
        where = f" on node {node}" if node is not None else ""
        super().__init__(f"task {task!r} {reason}{where}")

    def __reduce__(self):
        return (_rebuild_cancelled, (self.task, self.reason, self.node))


def _rebuild_cancelled(task, reason, node):
    return TaskCancelled(task, reason, node=node)


class CommandFailed(SkywardError):
    """A shell command started by :func:`skyward.shell` (with ``check=True``) exited with a
    non-zero code, or was killed by a signal (``exit_code`` negative, as ``subprocess`` says).

    ``log_tail`` holds the last lines of its output (stdout and stderr, in arrival order)."""

    def __init__(self, command: str, node: int | None, exit_code: int, log_tail: Sequence[str] = ()):
        self.command = command
        self.node = node
        self.exit_code = exit_code
        self.log_tail = list(log_tail)
        first = command.strip().splitlines()[0] if command.strip() else command
        shown = first if len(first) <= 100 and first == command.strip() else first[:100] + " ..."
        where = f" on node {node}" if node is not None else ""
        msg = f"command {shown!r} failed{where} ({_exit_text(exit_code)})"
        if self.log_tail:
            msg += "\n  last output:\n" + _tail(self.log_tail)
        super().__init__(msg)

    def __reduce__(self):
        return (CommandFailed, (self.command, self.node, self.exit_code, self.log_tail))


class FileMountError(SkywardError):
    """A ``file_mounts`` bucket could not be copied, mounted or unmounted on a node.

    ``action`` is ``"copy"``, ``"mount"`` or ``"unmount"``; ``url`` the bucket, ``dest`` the
    path on the node; ``tool`` the command that failed (None: the node has none of ``tools``,
    the ones that would do); ``reason`` what went wrong (the tool's last lines)."""

    def __init__(self, action: str, url: str, dest: str, reason: str, *, tool: str | None = None,
                 tools: Sequence[str] = ()):
        self.action = action
        self.url = url
        self.dest = dest
        self.reason = reason
        self.tool = tool
        self.tools = tuple(tools)
        what = {"copy": f"copy {url} to {dest}", "mount": f"mount {url} at {dest}"}.get(action, f"{action} {dest}")
        super().__init__(f"file_mounts: could not {what}" + (f" with {tool}" if tool else "") + f": {reason}")

    def __reduce__(self):  # keyword-only fields survive pickling
        return (_rebuild_file_mount_error, (self.action, self.url, self.dest, self.reason, self.tool, self.tools))


def _rebuild_file_mount_error(action, url, dest, reason, tool, tools):
    return FileMountError(action, url, dest, reason, tool=tool, tools=tools)
