"""Where Slurm's commands run: on this machine (a login node), or on a login node over SSH.

:class:`SlurmCommands` runs one command (``sbatch``, ``squeue``, ``scontrol``, ``sinfo``,
``scancel``) and answers as :func:`subprocess.run` would: its exit code, stdout and stderr.
With a login host it runs the command there, in an exec channel of one SSH connection made by
the project's transport (:class:`~skyward.transport.ssh.SSHTransport`: ``~/.ssh/config``, the
agent, ProxyJump and host keys as for ``sky.SSH``), so a laptop drives the cluster; the
connection is opened on first use and kept until :meth:`SlurmCommands.close`.

A request for an allocation (``salloc``, ``sbatch``) is run by :meth:`SlurmCommands.request`,
never cut short by an interrupt of the caller: a request killed while Slurm handles it can get
its allocation after whoever cleans up has looked (the controller creates the job, then fails to
answer a dead ``sbatch``; ``salloc --no-shell`` hit by a Ctrl-C while its request is in flight
takes the grant and exits 0 without saying it). So the request runs in a thread of its own, in a
session of its own on this machine (a terminal's Ctrl-C does not reach it); on the login node in
an SSH channel whose end kills it (a dropped connection leaves no request behind). An interrupt
(Ctrl-C) waits for the request's answer before it goes on, so any job the request made is in
Slurm's queue by then, where the caller's cleanup finds it. Only a request that outlives its own
timeout is killed, and then ``salloc``'s late grant is ended by the controller itself (it cancels
an allocation whose answer it cannot deliver); ``sbatch``'s would not be: the caller looks for
a job of the pool's name for a while and cancels it (:data:`UNANSWERED` marks such a request's
error; :meth:`~skyward.providers.slurm.allocations.Allocations.let_go`).

The readings of Slurm's output that more than one step needs live here too: ``scontrol show``'s
fields of a job, of nodes and of partitions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.errors import BootstrapError, ConfigError, ProvisionError
from skyward.machine import SSHAddress

if TYPE_CHECKING:
    from skyward.providers.ssh import SSH

__all__ = ["COMMANDS", "UNANSWERED", "Said", "SlurmCommands"]

#: The commands the provider runs (on the login node).
COMMANDS = ("sbatch", "salloc", "squeue", "scancel", "scontrol", "sinfo", "srun")
#: The ProvisionError code of a command whose answer never came (timed out, login node lost):
#: what it did is unknown.
UNANSWERED = "unanswered"


@dataclass(frozen=True, slots=True)
class Said:
    """A command's answer: exit code, stdout, stderr; and for a request, the interrupt that came
    while it ran (:meth:`SlurmCommands.request`), for the caller to raise once it has read the answer."""

    returncode: int
    stdout: str
    stderr: str
    interrupted: BaseException | None = None

    def said(self) -> str:
        """What the command said on failure, in one line."""
        lines = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        return " ".join(lines[-2:]) or f"exit code {self.returncode}"


class SlurmCommands:
    """Runs Slurm's commands on this machine (``login=None``) or on ``login`` over SSH.

    ``shown`` is how errors name the login host (what the user wrote)."""

    def __init__(self, login: SSHAddress | None = None, shown: str = ""):
        self.login = login
        self.shown = shown
        self._ssh: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # (a provider is pickled with a managed job: no connection)
        return {"login": self.login, "shown": self.shown}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["login"], state["shown"])  # type: ignore[misc]

    def _transport(self) -> Any:
        with self._lock:
            if self._ssh is None:
                from skyward.transport.ssh import SSHTransport

                assert self.login is not None
                self._ssh = SSHTransport.to(self.login)
            return self._ssh

    def reachable(self) -> None:
        """Check that Slurm's commands can run: every one of :data:`COMMANDS` on ``PATH`` (on the
        login host, reached over SSH). Raises ConfigError naming ``login`` (or ``provider``)."""
        if self.login is None:
            missing = [c for c in COMMANDS if shutil.which(c) is None]
            if missing:
                raise ConfigError("provider", "a machine where Slurm's commands (" + ", ".join(COMMANDS) + ") are "
                                  "on PATH: a login node of the cluster, or sky.Slurm(login='user@host')",
                                  f"sky.Slurm() without {', '.join(missing)}")
            return
        try:
            self._transport().connect()
        except BootstrapError as exc:
            raise ConfigError("login", "a login node reachable over SSH as `ssh` reaches it (~/.ssh/config, the "
                              "agent, ProxyJump)", self.shown, detail=str(exc).splitlines()[0]) from exc
        probe = "; ".join(f"command -v {c} >/dev/null 2>&1 || echo {c}" for c in COMMANDS)
        missing = self.run(["sh", "-c", probe]).stdout.split()
        if missing:
            raise ConfigError("login", "a login node where Slurm's commands (" + ", ".join(COMMANDS) + ") are on "
                              "PATH", self.shown, detail=f"{', '.join(missing)} not found there")

    def run(self, argv: list[str], timeout: float = 60.0, *, alone: bool = False) -> Said:
        """Run ``argv``; a command that does not answer within ``timeout`` raises ProvisionError.
        ``alone``: in a session of its own here, under a dead man's switch on a login node."""
        shown = shlex.join(argv)[:80]
        if self.login is None:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                      start_new_session=alone)
            except FileNotFoundError as exc:
                raise ConfigError("provider", "a machine where Slurm's commands are on PATH",
                                  shlex.join(argv[:1])) from exc
            except subprocess.TimeoutExpired as exc:
                raise ProvisionError(f"`{shown}` did not answer within {timeout:g}s", provider="slurm",
                                     code=UNANSWERED) from exc
            return Said(done.returncode, done.stdout, done.stderr)
        try:
            if alone:
                said: dict[str, list[str]] = {"stdout": [], "stderr": []}
                code = self._transport().stream(shlex.join(argv), lambda kind, line: said[kind].append(line),
                                                timeout=timeout)
                return Said(code, "\n".join(said["stdout"]), "\n".join(said["stderr"]))
            result = self._transport().run(shlex.join(argv), timeout=timeout)
        except TimeoutError as exc:
            raise ProvisionError(f"`{shown}` on {self.shown} did not answer within {timeout:g}s",
                                 provider="slurm", code=UNANSWERED) from exc
        except (BootstrapError, OSError, EOFError) as exc:
            raise ProvisionError(f"cannot run `{shown}` on the login node {self.shown}: {exc}",
                                 provider="slurm", code=UNANSWERED) from exc
        return Said(result.exit_code, result.stdout, result.stderr)

    def request(self, argv: list[str], waiting: Callable[[], None], timeout: float = 60.0) -> Said:
        """Run a request for an allocation to its answer, whatever interrupts the caller
        meanwhile (see the module docstring): an interrupt calls ``waiting`` (once) and comes
        back in the answer's ``interrupted`` (raised at once if the request itself failed)."""
        answer: list[Any] = []
        done = threading.Event()

        def ask() -> None:
            try:
                answer.append(self.run(argv, timeout, alone=True))
            except BaseException as exc:  # (raised in the caller's thread)
                answer.append(exc)
            finally:
                done.set()

        threading.Thread(target=ask, name=f"skyward-slurm-{argv[0]}", daemon=True).start()
        interrupted: BaseException | None = None
        while not done.is_set():  # (an Event: a Thread.join interrupted may take the thread for ended)
            try:
                done.wait()
            except BaseException as exc:  # (a Ctrl-C: the request goes on to its answer first)
                if interrupted is None:
                    interrupted = exc
                    with contextlib.suppress(BaseException):
                        waiting()
        if isinstance(answer[0], BaseException):
            raise interrupted or answer[0]
        return dataclasses.replace(answer[0], interrupted=interrupted)

    def close(self) -> None:
        with self._lock:
            ssh, self._ssh = self._ssh, None
        if ssh is not None:
            ssh.close()

    # -- scontrol's readings ------------------------------------------------------------------------
    def job_fields(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job`` (empty once Slurm has forgotten it)."""
        return _fields(self.run(["scontrol", "show", "job", "--oneliner", job], timeout=10).stdout)

    def nodes(self, nodelist: str, timeout: float = 60.0) -> dict[str, dict[str, str]]:
        """``scontrol show node``'s fields of each node of ``nodelist`` (Slurm's ``h[1-2]`` form
        or names joined by commas), by name."""
        if not nodelist or nodelist == "(null)":
            return {}
        out = self.run(["scontrol", "show", "node", "--oneliner", nodelist], timeout=timeout).stdout
        found = {}
        for line in out.splitlines():
            fields = _fields(line)
            if "NodeName" in fields:
                found[fields["NodeName"]] = fields
        return found

    def partitions(self) -> list[dict[str, str]]:
        """``scontrol show partition``'s fields of every partition."""
        out = self.run(["scontrol", "show", "partition", "--oneliner"]).stdout
        return [f for f in map(_fields, out.splitlines()) if "PartitionName" in f]


def _fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


def login_host(login: str | SSH | None) -> SSH | None:
    """The login node as an SSH provider of one host (``"user@host"`` read as ``sky.SSH`` reads
    a host: ``~/.ssh/config``, the agent, ProxyJump)."""
    from skyward.providers.ssh import SSH

    accepted = "None, \"user@host\" (a login node reached over SSH) or sky.SSH([...]) of one host"
    if login is None or (isinstance(login, SSH) and len(login.hosts) == 1):
        return login
    if not isinstance(login, str):
        raise ConfigError("login", accepted, login)
    try:
        return SSH([login])
    except ConfigError as exc:
        raise ConfigError("login", accepted, login, detail=str(exc)) from exc
