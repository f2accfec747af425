"""A managed jobs' controller on another host: the one-node named cluster that
``SKYWARD_JOBS_CONTROLLER`` names (SkyPilot's jobs controller on an SSH host).

With the variable unset (and no AWS job: :mod:`skyward.jobs.aws`) or ``local``, the controller is
a detached process on this machine (:mod:`skyward.jobs.controller`). Set to a cluster's name (``skyward launch -c jobs-ctl ...`` or
``sky.ComputePool(name="jobs-ctl", provider=sky.SSH([host]))`` made it, on one node), every
``skyward jobs`` command and ``sky.jobs`` call of this machine asks that node instead:

1. each ask is one command over the cluster's own transport (the same SSH connection, host key
   and key as its workers'), run by the Python the cluster's workers run (the client's skyward,
   shipped when the cluster was made): ``python -m skyward.jobs.answer VERB ...``
   (:mod:`skyward.jobs.answer`), which does there what this machine would do with a local
   controller, and answers with a pickle (a value or the typed error raised there);
2. the controller runs on that node, started by the first ask that needs it, in a session of its
   own: it outlives the SSH command, and this machine may shut down; while it runs it counts as
   a running job of the cluster, so the cluster's autostop waits for it; it exits after the idle
   seconds of the client whose ask started it (``SKYWARD_JOBS_CONTROLLER_IDLE``, default 600);
3. its records and logs live on that node, under ``~/.skyward/controllers/<cluster id>``
   (its own skyward home: two controller clusters on one host never mix their jobs), so they
   survive the controller's restart and any client's;
4. the jobs' clusters are made from there, with the provider each job was given (pickled with
   it): an SSH provider's key and known-hosts files must exist at the same paths on the
   controller's host.

A controller that cannot be reached is a :class:`~skyward.ClusterError` naming the cluster and
its host; an unknown value (not ``aws``, ``local`` nor a cluster's name) or a cluster of several
nodes, a :class:`~skyward.ConfigError` naming the variable, what it may hold and what it held.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import shlex
from typing import IO, Any

from skyward.clusters.state import ClusterRecord, ClusterStore
from skyward.errors import ClusterError, ConfigError
from skyward.jobs.controller import CLUSTER_USE, IDLE_VARIABLE

__all__ = ["ANSWER_MARK", "LOCAL", "VARIABLE", "RemoteController", "controller_home", "named"]

#: The variable that names the controller's cluster (``aws``: :mod:`skyward.jobs.aws`; ``local``:
#: this machine's; unset or empty: as the job says, :func:`skyward.jobs.aws.chosen`).
VARIABLE = "SKYWARD_JOBS_CONTROLLER"
#: The value of :data:`VARIABLE` that keeps the controller on this machine, whatever the job.
LOCAL = "local"
#: The line before the answer's pickle on the node's standard output (what comes before it, a
#: followed log, is passed on as it comes).
ANSWER_MARK = "\0skyward-answer:"
#: Seconds an ask that does not wait on a job may take (connection, a Python start, the query).
ASK_TIMEOUT = 120.0


def controller_home(record: ClusterRecord) -> str:
    """The controller's skyward home on its node (``~`` expanded there)."""
    return f"~/.skyward/controllers/{record.id}"


def named() -> RemoteController | None:
    """The controller :data:`VARIABLE` names, or None (this machine's: unset, or :data:`LOCAL`)."""
    name = os.environ.get(VARIABLE, "").strip()
    return RemoteController(name) if name and name.lower() != LOCAL else None


class RemoteController:
    """The controller on node 0 of the one-node named cluster ``name``."""

    def __init__(self, name: str):
        record = ClusterStore().get(name)
        if record is None or record.nodes != 1 or not record.pythons:
            known = sorted(r.name for r in ClusterStore().all() if r.nodes == 1 and r.pythons)
            accepted = ("'aws' (the controller on an AWS instance), 'local' (this machine's), or the name of a "
                        "one-node named cluster of this machine to run the managed jobs' controller ("
                        + (", ".join(known) if known else "none: make one on the host with sky.ComputePool(name=NAME, "
                           "provider=sky.SSH([HOST]))") + ")")
            got = name if record is None else f"{name} ({record.nodes} nodes)"
            raise ConfigError(VARIABLE, accepted, got)
        self.record = record
        self.where = f"cluster {name} ({_host(record)})"

    def ask(self, verb: str, *args: object, stdin: bytes | None = None, timeout: float | None = ASK_TIMEOUT,
            out: IO[str] | None = None) -> Any:
        """Run ``verb`` on the controller's node; its answer (an error raised there is raised
        here, with its type). Output before the answer goes to ``out`` line by line as it comes."""
        from skyward.transport import reach

        cluster_dir = f"{self.record.roots[0]}/c/{self.record.id}" if self.record.roots else ""
        idle = os.environ.get(IDLE_VARIABLE, "")  # (a controller this ask starts takes this client's)
        command = (f"SKYWARD_HOME={shlex.quote(controller_home(self.record))} "
                   f"{CLUSTER_USE}={shlex.quote(cluster_dir)} "
                   + (f"{IDLE_VARIABLE}={shlex.quote(idle)} " if idle else "")
                   + shlex.join([self.record.pythons[0], "-m", "skyward.jobs.answer", verb, *map(str, args)]))
        answer: list[str] = []
        errors: list[str] = []
        transport = reach(self.record.instances[0])
        try:
            if out is None:
                result = transport.run(command, timeout=timeout, stdin=stdin)
                code, errors = result.exit_code, result.stderr.splitlines()
                answer = [line for line in result.stdout.splitlines() if line.startswith(ANSWER_MARK)]
            else:
                def line(stream: str, text: str) -> None:
                    if stream == "stderr":
                        errors.append(text)
                    elif text.startswith(ANSWER_MARK):
                        answer.append(text)
                    else:
                        out.write(text + "\n")
                        out.flush()

                code = transport.stream(command, line, timeout=timeout)
        except (OSError, TimeoutError, ClusterError, EOFError) as exc:
            raise self._unreachable(str(exc)) from exc
        except Exception as exc:  # (paramiko's own errors, a failed connect: BootstrapError)
            raise self._unreachable(f"{type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                transport.close()
        if not answer:
            raise self._unreachable(f"`{verb}` ended with exit code {code} and no answer"
                                    + (f": {' | '.join(errors[-3:])}" if errors else ""))
        kind, value = pickle.loads(base64.b64decode(answer[-1][len(ANSWER_MARK):]))
        if kind == "error":
            raise value
        return value

    def _unreachable(self, why: str) -> ClusterError:
        return ClusterError(self.record.name, f"the managed jobs' controller on {self.where} cannot be asked ({why})",
                            way_out=f"check that the host is up (`skyward status {self.record.name}`), or unset "
                                    f"{VARIABLE} to use this machine's controller")


def _host(record: ClusterRecord) -> str:
    ssh = record.instances[0].ssh if record.instances else None
    return "this machine" if ssh is None else f"{ssh.user}@{ssh.host}" if ssh.user else str(ssh.host)
