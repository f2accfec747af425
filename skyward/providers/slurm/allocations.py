"""Asking Slurm for an allocation, what a refusal means, and cancelling one, confirmed.

The request (:meth:`Allocations.salloc_argv`, :meth:`Allocations.sbatch_argv`) is built
without I/O from the provider's options. :meth:`Allocations.submit` takes it with ``salloc
--immediate`` when the cluster can grant it at once, else queues it with ``sbatch``; a
refusal is a ConfigError naming the option Slurm refused (:meth:`Allocations.refused`).

Nothing is left by a request cut short. A Ctrl-C can land while Slurm handles a request, or
after it granted one and before the provider read the job id from the command's answer. The
request is never killed for it: it runs on to its answer (:meth:`SlurmCommands.request
<skyward.providers.slurm.commands.SlurmCommands.request>`; the console says the interrupt waits
for it), so whatever job it made is in Slurm's queue once it has ended. Then the failed
allocation is let go by :meth:`Allocations.let_go`: the jobs this thread asked for, and any job
of the pool's name (``skyward-<pool id>``, the user's own) that the provider neither holds nor
waits for in another thread, are cancelled, each until squeue no longer lists it running or
pending. Requests are made one at a time in a process, and the job ids recorded under the same
lock, so no other request's job is unrecorded then.

A failed ``squeue`` (or ``scancel``) means "unknown", never "gone": it is asked again for
:attr:`Allocations.cancel_wait` seconds, and if Slurm still does not answer, a ProvisionError
says which jobs are not confirmed gone and the ``squeue`` and ``scancel`` to run once it does.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator

from skyward._retry import Backoff
from skyward.errors import ConfigError, ProvisionError
from skyward.providers.base import PoolSpec
from skyward.providers.slurm.commands import Said, SlurmCommands

__all__ = ["ENDED", "Allocations", "looks"]

#: Job states after which an allocation will never run (squeue's long names).
ENDED = frozenset({"CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                   "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
#: Seconds between two looks at a job: from FIRST_LOOK, growing to POLL. An idle cluster grants
#: a job at its next scheduling pass, well under a second after submission (a pool's start
#: waited half a second more at a constant 0.5 s, measured with bench/slurm.py); a long wait in
#: the queue is asked about twice a second at most.
FIRST_LOOK = 0.05
POLL = 0.5
#: One request at a time in this process, its job id recorded before the next (see the docstring).
_ONE_REQUEST = threading.Lock()


def looks() -> Iterator[float]:
    """The pauses between looks at a job: FIRST_LOOK, growing to POLL."""
    return Backoff(delay=FIRST_LOOK, factor=1.5, max_delay=POLL).pauses()


class Allocations:
    """The part of :class:`~skyward.providers.slurm.Slurm` that asks for allocations and
    cancels them (its options are the provider's)."""

    name: str
    commands: SlurmCommands
    partition: str | None
    account: str | None
    qos: str | None
    time: str
    constraint: str | None
    extra_args: tuple[str, ...]
    #: Job id -> the ids of the pool's instances in it; job id -> the thread waiting for it.
    _held: dict[str, set[str]]
    _asked: dict[str, int]
    #: Seconds a release waits for Slurm to confirm a job gone, asking again while Slurm does not
    #: answer (then a ProvisionError names the job and the ``scancel`` to run).
    cancel_wait: float = 60.0
    #: Seconds an allocation request (salloc, sbatch) may take before it is killed.
    request_timeout: float = 60.0

    # -- plan: the request, without I/O --------------------------------------------------------
    def sbatch_argv(self, spec: PoolSpec) -> list[str]:
        """The ``sbatch`` command that asks for ``spec``'s allocation."""
        argv = ["sbatch", "--parsable", *self._request(spec), "--output=/dev/null", "--error=/dev/null",
                "--no-requeue"]  # (a failed node would otherwise put the allocation back in the queue)
        # The batch script only holds the allocation: the workers are steps started beside it.
        return [*argv, *self.extra_args, "--wrap=exec sleep infinity"]

    def salloc_argv(self, spec: PoolSpec) -> list[str]:
        """The ``salloc`` command that takes ``spec``'s allocation at once, or fails leaving
        nothing queued (an allocation without a batch script; never requeued)."""
        return ["salloc", "--no-shell", "--immediate", *self._request(spec), *self.extra_args]

    def _request(self, spec: PoolSpec) -> list[str]:
        argv = [f"--job-name=skyward-{spec.pool_id}", f"--nodes={spec.nodes}", f"--time={self.time}"]
        for option, value in (("partition", self.partition), ("account", self.account), ("qos", self.qos),
                              ("constraint", self.constraint)):
            if value is not None:
                argv.append(f"--{option}={value}")
        gpus = getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0
        return [*argv, f"--gres=gpu:{gpus}"] if gpus else argv

    # -- ask -----------------------------------------------------------------------------------
    def submit(self, spec: PoolSpec, report: Callable[[str], None] = lambda line: None) -> str:
        """Ask for ``spec``'s allocation; its job id, recorded as this thread's. An interrupt
        meanwhile waits for the request's answer (saying so through ``report``)."""
        with _ONE_REQUEST:
            job, interrupted = self._ask(spec, report)
            self._asked[job] = threading.get_ident()
        if interrupted is not None:  # (after the request's answer: its job is cancelled as this thread's)
            raise interrupted
        return job

    def _ask(self, spec: PoolSpec, report: Callable[[str], None]) -> tuple[str, BaseException | None]:
        # An idle cluster grants salloc's request as it is made; sbatch's waits for the next
        # scheduling pass (2 s on the test cluster: most of a pool's start, bench/slurm.py).
        # salloc --immediate fails, leaving nothing queued, when the nodes are busy: then the
        # job queues with sbatch, and any refusal is sbatch's.
        def waiting(command: str) -> Callable[[], None]:
            return lambda: report(f"interrupted: waiting for Slurm's answer to {command} to cancel what it got")

        granted = self.commands.request(self.salloc_argv(spec), waiting("salloc"), self.request_timeout)
        found = re.search(r"Granted job allocation (\d+)", granted.stderr + granted.stdout)
        if granted.returncode == 0 and found:
            return found.group(1), granted.interrupted
        if granted.interrupted is not None:
            raise granted.interrupted
        result = self.commands.request(self.sbatch_argv(spec), waiting("sbatch"), self.request_timeout)
        if result.returncode == 0:
            return result.stdout.strip().split(";")[0], result.interrupted
        raise result.interrupted or self.refused(spec, result.said())

    def held(self, job: str, ids: set[str]) -> None:
        """``job`` runs the pool's instances ``ids``: held from now on."""
        self._held[job] = ids
        self._asked.pop(job, None)

    def let_go(self, spec: PoolSpec, late: bool = False) -> None:
        """Cancel what this thread's failed allocation got, or may have got (see the docstring).
        ``late``: a request was killed unanswered, so its job may come later: look for one of the
        pool's name for up to ``cancel_wait`` seconds. Raises ProvisionError naming what is left
        to check when Slurm cannot be asked."""
        me, timeout = threading.get_ident(), self.cancel_wait
        name = f"skyward-{spec.pool_id}"
        deadline, pauses, found = time.monotonic() + timeout, looks(), False
        unconfirmed: list[ProvisionError] = []
        while True:
            with _ONE_REQUEST:
                others = {job for job, thread in self._asked.items() if thread != me} | set(self._held)
                mine = {job for job, thread in self._asked.items() if thread == me}
                listed = self.asked(["squeue", "-h", "--me", f"--name={name}", "-o", "%i"], deadline)
                strays = set(listed.stdout.split()) - others if listed.returncode == 0 else set()
            if listed.returncode != 0:
                unconfirmed.append(self.unconfirmed(f"jobs named {name}", listed.said(), timeout,
                                                    f"squeue --me --name={name}", f"scancel --me --name={name}"))
            for job in sorted(mine | strays):
                found = True
                self._asked.pop(job, None)
                self._held.pop(job, None)
                try:
                    self.cancel(job, timeout)
                except ProvisionError as exc:
                    unconfirmed.append(exc)
            if unconfirmed or found or not late:
                break
            if time.monotonic() >= deadline:
                unconfirmed.append(ProvisionError(
                    f"no job named {name} came of the request Slurm did not answer within {timeout:g}s; should "
                    f"`squeue --me --name={name}` list one later, end it with `scancel --me --name={name}`",
                    provider=self.name))
                break
            time.sleep(next(pauses))
        if unconfirmed:
            raise ProvisionError("; ".join(str(exc) for exc in unconfirmed), provider=self.name)

    # -- what Slurm refused ----------------------------------------------------------------------
    def refused(self, spec: PoolSpec, said: str) -> Exception:
        """The error for a request Slurm refused at submission, naming what it refused."""
        lower = said.lower()
        if "account" in lower:  # ("Invalid account or account/partition combination specified")
            return ConfigError("account", f"an account you may charge ({self._associated('account')})",
                               self.account, detail=f"Slurm said: {said}")
        if "qos" in lower:
            return ConfigError("qos", f"a QOS your account may use ({self._associated('qos')})", self.qos,
                               detail=f"Slurm said: {said}")
        if "partition" in lower:
            return ConfigError("partition", f"one of the cluster's partitions ({', '.join(self.partitions())})",
                               self.partition, detail=f"Slurm said: {said}")
        if "node count" in lower or "node configuration" in lower:
            return self.too_many(spec, self.partition_nodes(), f"Slurm said: {said}")
        if "time limit" in lower:
            return ConfigError("time", "a time limit within the partition's", self.time, detail=f"Slurm said: {said}")
        return ProvisionError(f"sbatch refused the allocation: {said}", provider=self.name)

    def _associated(self, column: str) -> str:
        """The accounts (or QOS) of the user's associations, from Slurm's accounting database."""
        listed = self.commands.run(["sh", "-c", f'sacctmgr -n -P show assoc user="$(id -un)" format={column}'],
                                   timeout=30)
        names = sorted({n for n in listed.stdout.replace("\n", ",").split(",") if n.strip()})
        return ", ".join(names) if listed.returncode == 0 and names else "see `sacctmgr show assoc user=$USER`"

    def too_many(self, spec: PoolSpec, total: int, why: str) -> ConfigError:
        where = f"partition {self.partition}" if self.partition else "the default partition"
        accepted = f"at most {total} (the nodes of {where})" if total else f"fewer nodes ({where})"
        return ConfigError("nodes", accepted, spec.nodes, detail=why)

    def partitions(self) -> list[str]:
        """The cluster's partition names (the default one marked ``*`` by sinfo, unmarked here)."""
        out = self.commands.run(["sinfo", "-h", "-o", "%R"]).stdout
        return sorted({line.strip() for line in out.splitlines() if line.strip()})

    def partition_nodes(self) -> int:
        """How many nodes the partition asked for (or the default one) has; 0 if unknown."""
        argv = ["sinfo", "-h", "-o", "%D %P"] + ([f"--partition={self.partition}"] if self.partition else [])
        total = 0
        for line in self.commands.run(argv).stdout.splitlines():
            count, _, name = line.partition(" ")
            if self.partition or name.endswith("*"):
                with contextlib.suppress(ValueError):
                    total += int(count)
        return total

    # -- cancel --------------------------------------------------------------------------------
    def cancel(self, job: str, timeout: float | None = None) -> None:
        """Cancel ``job`` and wait until Slurm no longer runs it; raise ProvisionError if it still
        does after ``timeout``, or if Slurm could not be asked meanwhile (a failed ``squeue`` or
        ``scancel`` is asked again, never read as "gone"): the error names the command to run."""
        timeout = self.cancel_wait if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pauses = looks()
        sent = False
        while True:
            if not sent:  # (again after a failed scancel: the controller may be back)
                sent = self.asked(["scancel", "--quiet", job], deadline, once=True).returncode == 0
            result = self.asked(["squeue", "-h", f"--jobs={job}", "-o", "%T"], deadline, once=True)
            state = result.stdout.strip()
            gone = "invalid job id" in result.stderr.lower()  # (Slurm has forgotten it)
            if gone or (result.returncode == 0 and (not state or state in ENDED)):
                return
            if time.monotonic() >= deadline:
                if result.returncode != 0:
                    raise self.unconfirmed(f"job {job}", result.said(), timeout, f"squeue --jobs={job}",
                                           f"scancel {job}")
                raise ProvisionError(f"Slurm job {job} still {state} {timeout:g}s after scancel", provider=self.name)
            time.sleep(next(pauses))

    def asked(self, argv: list[str], deadline: float, once: bool = False) -> Said:
        """``argv``'s answer, asked again while it fails until ``deadline`` (once: not again);
        a command that did not answer in time comes back as a failure (exit code -1)."""
        pauses = looks()
        while True:
            try:
                result = self.commands.run(argv, timeout=max(1.0, deadline - time.monotonic()))
            except ProvisionError as exc:  # (it did not answer in time, or the login node is out of reach)
                result = Said(-1, "", str(exc))
            if once or result.returncode == 0 or time.monotonic() >= deadline:
                return result
            time.sleep(min(next(pauses), max(0.0, deadline - time.monotonic())))

    def unconfirmed(self, what: str, said: str, timeout: float, check: str, end: str) -> ProvisionError:
        """The error for Slurm's {what} not confirmed gone: Slurm could not be asked."""
        return ProvisionError(f"Slurm's {what} not confirmed gone: Slurm could not be asked for {timeout:g}s "
                              f"({said}); once it answers, check with `{check}` and end it with `{end}`",
                              provider=self.name)
