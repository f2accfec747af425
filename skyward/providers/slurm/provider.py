"""The Slurm provider: a pool is one Slurm allocation, and each worker is a job step on its node.

Acquire: ``sbatch`` asks for an allocation of ``nodes`` nodes (job name ``skyward-<pool id>``)
whose batch script only sleeps; Slurm checks the request as it is submitted, so an unknown
partition, account or QOS, or more nodes than the partition has, is a ConfigError naming the
value and what Slurm said, before anything waits. Then ``squeue`` is asked until the job runs:
while it is pending each change of Slurm's reason (``Resources``, ``Priority``...) and of its
place in the queue is reported to the console; the wait is bounded by the pool's
``start_timeout``. Whatever ends the wait early (the timeout, Ctrl-C, an error), the job is
cancelled before the exception leaves, and so is one Slurm granted to a request interrupted before
its job id was read (:mod:`~skyward.providers.slurm.allocations`).

Reach: each node's :class:`~skyward.machine.Instance` carries the command that starts a process
on it inside the allocation (``srun --jobid=J --overlap -N1 -n1 -w NODE``): the pool starts its
workers through that command and speaks the worker protocol over the step's stdio, as it does
over a Local worker's pipe. No port is opened; Slurm accounts for the steps and ends them with
the job. The workers run in the client's own interpreter, which the compute nodes see at the
same path (a login node and its compute nodes share the filesystem).

From elsewhere (``login="user@host"``): every Slurm command runs on the login node over one
SSH connection (:mod:`~skyward.providers.slurm.commands`), and each instance carries the login
node's SSH address beside its ``srun`` launcher, so the pool reaches it with the SSH transport:
the environment is built once on the login node (in the shared home, ``~/.skyward``), and
``srun`` started there carries the worker's stdio through the SSH channel.

Before anything is queued, what Slurm would let pend for ever is refused: more nodes than the
partition has, a ``time`` above its ``MaxTime``, more GPUs per node than its nodes have
(:mod:`~skyward.providers.slurm.limits`).

Losses: when a worker's step ends, Slurm is asked why (``scontrol show job``): a job ended by
its time limit (state ``TIMEOUT``) is :class:`~skyward.errors.SlurmTimeLimit`, the pool's end;
anything else (``NODE_FAIL``, ``PREEMPTED``, a step killed) is a WorkerLost naming the Slurm
node and the job's state, which ``replace_lost`` replaces: :meth:`Slurm.acquire` asks for a new
single-node allocation per lost node.

Named clusters: the allocation is the cluster. Its workers are job steps that outlive the
client (:mod:`skyward.clusters.steps`); one that ends by its autostop runs
:attr:`Slurm.autostop_release` (``scancel``), :meth:`Slurm.machine_states` tells a cluster
whose allocation Slurm ended (``stopped``), and :meth:`Slurm.start` asks for a new one.

Release: ``scancel`` the job, then wait until Slurm no longer runs it; a Slurm that does not
answer for ``cancel_wait`` seconds is a ProvisionError naming the job and its ``scancel``. A node released alone
(lost, replaced) cancels its job only once no node of the pool holds it any more.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from skyward.errors import CapacityError, ConfigError, ProvisionError, SlurmTimeLimit, WorkerLost
from skyward.providers.base import HostEnvironment, Instance, PoolSpec, Provider
from skyward.providers.slurm import limits
from skyward.providers.slurm.allocations import ENDED, POLL, Allocations, looks
from skyward.providers.slurm.commands import UNANSWERED, SlurmCommands, login_host

if TYPE_CHECKING:
    from skyward.providers.ssh import SSH

__all__ = ["Slurm"]
#: Seconds a lost worker's job may take to show how it ended (not COMPLETING any more).
SETTLE = 10.0


class Slurm(Allocations, Provider):
    """Run a pool inside a Slurm allocation: one job of ``nodes`` nodes, a worker per node (or
    ``processes_per_node`` of them) started as job steps with ``srun``.

    Args:
        partition: the partition to ask (None: the cluster's default one).
        account: the account charged (None: the user's default).
        qos: the quality of service (None: the default).
        time: the allocation's time limit, in Slurm's format (``"1:00:00"``, ``"2-00:00:00"``).
        login: where Slurm's commands run. None: on this machine (a login node).
            ``"user@host"``: on that login node, over SSH as ``ssh user@host`` reaches it
            (``~/.ssh/config``'s ``HostName``, ``Port``, ``IdentityFile``, ``ProxyJump``, the
            agent; host keys checked), so a laptop drives the cluster; the workers' stdio
            travels through that connection, and their environment is built once on the
            login node under ``~/.skyward``, which the compute nodes must share. A
            ``sky.SSH([...])`` of one host says more (``key``, ``known_hosts``, ``root`` for
            another shared directory, ``find_links``...).
        constraint: node features the nodes must have (``--constraint``).
        extra_args: more ``sbatch`` options, passed as they are.

    >>> import skyward as sky
    >>> with sky.ComputePool(provider=sky.Slurm(partition="gpu"), nodes=2) as pool:  # doctest: +SKIP
    ...     ...
    """

    name = "slurm"

    def __init__(self, partition: str | None = None, account: str | None = None, qos: str | None = None,
                 time: str = "1:00:00", login: str | SSH | None = None, constraint: str | None = None,
                 extra_args: Sequence[str] = ()):
        try:
            limits.seconds(time)
        except (ValueError, AttributeError):
            raise ConfigError("time", f"a Slurm time limit: {limits.TIME_FORMATS}", time) from None
        self.ssh = login_host(login)
        if isinstance(extra_args, str):
            raise ConfigError("extra_args", "a sequence of sbatch options, e.g. ('--exclusive',)", extra_args)
        self.partition = partition
        self.account = account
        self.qos = qos
        self.time = time
        self.login = login
        self.constraint = constraint
        self.extra_args = tuple(extra_args)
        self._held: dict[str, set[str]] = {}  # job id -> the ids of the pool's instances in it
        self._asked: dict[str, int] = {}  # job id -> the thread that waits for it (not held yet)
        self._wait = 3600.0  # how long an acquired allocation may pend: the pool's start_timeout
        self._spec: PoolSpec | None = None  # what provision() was asked for
        address = None if self.ssh is None else self.ssh.address(0)
        shown = login if isinstance(login, str) or address is None else f"{address.user}@{address.host}"
        self.commands = SlurmCommands(address, shown)

    def __setstate__(self, state: dict) -> None:  # (a cluster's record pickled before _asked existed)
        self.__dict__.update({"_asked": {}, **state})

    def validate(self, spec: PoolSpec) -> None:
        if spec.cluster is not None and self.ssh is not None:  # (a cluster's steps start on this machine)
            raise ConfigError("login", "None with a named cluster on sky.Slurm() (a cluster's workers are started "
                              "from the login node itself)", self.commands.shown)
        self.commands.reachable()

    @staticmethod
    def step_argv(job: str, node: str) -> tuple[str, ...]:
        """The command that starts one process on ``node`` inside job ``job``, its stdio carried
        back unbuffered (the worker protocol's frames are bytes, not lines)."""
        return ("srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
                "--unbuffered", "--quiet", "--kill-on-bad-exit=1")

    # -- acquire -------------------------------------------------------------------------------
    def provision(self, spec: PoolSpec) -> list[Instance]:
        return self.provision_waiting(spec, lambda line: None, 3600.0)

    def provision_waiting(self, spec: PoolSpec, report: Callable[[str], None], timeout: float) -> list[Instance]:
        # Slurm accepts a job wider than its partition and lets it pend for ever: refuse it here.
        total = self.partition_nodes()
        if total and spec.nodes > total:
            raise self.too_many(spec, total, f"sinfo counts {total} nodes in the partition")
        # ... and one asking for more time or GPUs than the partition gives.
        limits.check(self.commands, self.partition, self.time,
                         getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0)
        self._wait = timeout
        self._spec = spec  # (a cluster's record keeps this provider: start() asks for the same again)
        return self._allocate(spec, list(range(spec.nodes)), report, timeout)

    def _allocate(self, spec: PoolSpec, numbers: list[int], report: Callable[[str], None],
                  timeout: float) -> list[Instance]:
        """One allocation of ``len(numbers)`` nodes, described as the pool's nodes ``numbers``."""
        job = None
        try:  # (whatever cuts it short, a Ctrl-C in salloc included, leaves no allocation)
            job = self.submit(dataclasses.replace(spec, nodes=len(numbers)), report)
            nodes = self._wait_running(job, report, timeout)
            instances = self._describe(spec, job, nodes, numbers)
            self.held(job, {inst.id for inst in instances})
        except BaseException as exc:
            try:  # (a request killed unanswered: its job may come later)
                self.let_go(spec, late=job is None and isinstance(exc, ProvisionError) and exc.code == UNANSWERED)
            except ProvisionError as left:  # (Slurm could not be asked, a Ctrl-C's cleanup included:
                raise left from exc  # the user is told what to check, never that nothing is left)
            raise
        return instances

    can_acquire = True

    def acquire(self, spec: PoolSpec, nodes: list[int], exclude: frozenset[str]) -> list[Instance]:
        """A new single-node allocation for each node number (a lost node's replacement): a new
        job, so never an instance in ``exclude``; it may land on any node Slurm gives."""
        acquired: list[Instance] = []
        try:
            for number in nodes:
                acquired += self._allocate(spec, [number], lambda line: None, self._wait)
        except BaseException:
            self.terminate(acquired)
            raise
        return acquired

    def _wait_running(self, job: str, report: Callable[[str], None], timeout: float) -> list[str]:
        """Wait until ``job`` runs; its node names. Reports the pending reason as it changes."""
        deadline = time.monotonic() + timeout
        said = ""
        reason = ""
        pauses = looks()
        while True:
            result = self.commands.run(["squeue", "-h", f"--jobs={job}", "-o", "%T|%r|%N"])
            state, _, rest = result.stdout.strip().partition("|")
            reason, _, nodelist = rest.partition("|")
            if state == "RUNNING":
                return self.commands.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
            if state in ENDED or (result.returncode != 0 and not state):
                raise ProvisionError(f"Slurm job {job} ended before it ran ({state or result.said()}: {reason})",
                                     provider=self.name)
            if state == "PENDING":
                line = f"queued in Slurm as job {job}: {reason}{self._position(job)}"
                if line != said:
                    report(line)
                    said = line
            if time.monotonic() >= deadline:
                raise CapacityError(f"Slurm job {job} was not granted within start_timeout={timeout:g}s "
                                    f"(pending: {reason or state}); it was cancelled", provider=self.name)
            time.sleep(next(pauses))

    def _position(self, job: str) -> str:
        """``, 2nd in the queue`` (by Slurm's priority order among pending jobs), or nothing."""
        out = self.commands.run(["squeue", "-h", "--states=PENDING", "--sort=-p,i", "-o", "%i"]).stdout.split()
        if job not in out:
            return ""
        n = out.index(job) + 1
        suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        return f", {n}{suffix} in the queue"

    def _describe(self, spec: PoolSpec, job: str, nodes: list[str], numbers: list[int]) -> list[Instance]:
        addrs = {n: f["NodeAddr"] for n, f in self.commands.nodes(",".join(nodes)).items() if "NodeAddr" in f}
        gpus = getattr(spec.accelerator, "count", 0) if spec.accelerator is not None else 0
        ssh, environment = None, None
        if self.ssh is not None:  # the steps start on the login node; their environment is built there
            ssh = self.ssh.address(0)
            environment = dataclasses.replace(self.ssh.environment(), note=f"Slurm job {job} via {self.commands.shown}")
        return [Instance(id=f"slurm-{job}-{name}", node=i, private_addr=addrs.get(name, name), accelerators=gpus,
                         ssh=ssh, environment=environment, launcher=self.step_argv(job, name))
                for i, name in zip(numbers, nodes, strict=True)]

    # -- losses --------------------------------------------------------------------------------
    def explainer(self, instance: Instance) -> Callable[[WorkerLost], Exception]:
        return functools.partial(self.explain_loss, instance)

    def explain_loss(self, instance: Instance, lost: WorkerLost) -> Exception:
        """Why ``instance``'s worker is gone, as Slurm tells it: SlurmTimeLimit for a job ended
        by its time limit, else ``lost`` naming the Slurm node and the job's state."""
        job, name = job_of(instance), instance.id.split("-", 2)[2]
        fields = self.commands.job_fields(job)
        settle = time.monotonic() + SETTLE  # (an ending job shows COMPLETING until its nodes are clean)
        while fields.get("JobState") == "COMPLETING" and fields.get("Reason") != "TimeLimit" \
                and time.monotonic() < settle:
            time.sleep(POLL)
            fields = self.commands.job_fields(job)
        state, reason = fields.get("JobState", "no longer known to Slurm"), fields.get("Reason", "None")
        if state == "TIMEOUT" or reason == "TimeLimit":
            return SlurmTimeLimit(job, fields.get("TimeLimit", self.time), node=lost.node)
        said = f"Slurm job {job} is {state}" + ("" if reason == "None" else f" ({reason})")
        down = [f"{n} is {f.get('State')} ({f.get('Reason', '')})" for n, f in self.commands.nodes(fields.get("NodeList", ""), 10).items()
                if any(word in f.get("State", "") for word in ("DOWN", "FAIL", "DRAIN"))]
        said += "".join(f"; {d}" for d in down)
        return WorkerLost(lost.node, f"{lost.reason} on Slurm node {name}; {said}", exit_code=lost.exit_code,
                          log_tail=lost.log_tail, local_rank=lost.local_rank)

    # -- named clusters: the allocation is the cluster ------------------------------------------
    #: What a cluster worker's job step runs when the worker ended by its autostop
    #: (:mod:`skyward.clusters.steps`): the allocation ends with it.
    autostop_release = 'scancel --quiet "$SLURM_JOB_ID"'

    def machine_states(self, instances: list[Instance]) -> list[str]:
        """Each instance's machine as a named cluster sees it: ``running`` while its allocation
        runs, ``stopped`` once Slurm ended it (autostop, its time limit, a scancel) or forgot it."""
        result = self.commands.run(["squeue", "-h", "--me", "-o", "%i %T"], timeout=30)
        if result.returncode != 0:
            raise ConnectionError(f"squeue failed: {(result.stderr or result.stdout).strip()}")
        states = dict(line.split()[:2] for line in result.stdout.splitlines() if len(line.split()) >= 2)
        return ["running" if states.get(job_of(inst)) == "RUNNING" else "stopped" for inst in instances]

    def start(self, instances: list[Instance]) -> list[Instance]:
        """A stopped cluster's machines again: a new allocation of as many nodes, numbered alike."""
        spec = self._spec or PoolSpec("cluster", len(instances))
        spec = dataclasses.replace(spec, nodes=len(instances), max_nodes=None)
        return self._allocate(spec, sorted(inst.node for inst in instances), lambda line: None, self._wait)

    def stop(self, instances: list[Instance]) -> None:
        """``skyward stop``: a Slurm allocation cannot be paused, so it is released."""
        self.terminate(instances)

    # -- release -------------------------------------------------------------------------------
    def terminate(self, instances: list[Instance]) -> None:
        jobs = sorted({job_of(inst) for inst in instances})
        for job in jobs:
            self._held.pop(job, None)
            self.cancel(job)
        if not self._held:  # (the next pool opens the login connection again)
            self.commands.close()

    def release(self, instances: list[Instance]) -> None:
        """Release some nodes of a running pool: a job is cancelled once none of the pool's
        nodes is in it any more (a node of a wider allocation stays allocated until then)."""
        for inst in instances:
            job = job_of(inst)
            held = self._held.get(job, set())
            held.discard(inst.id)
            if not held:
                self.terminate([inst])

    def __repr__(self) -> str:
        shown = [f"{k}={v!r}" for k, v in (("partition", self.partition), ("account", self.account),
                                           ("qos", self.qos), ("constraint", self.constraint)) if v is not None]
        login = [f"login={self.commands.shown!r}"] if self.ssh is not None else []
        return f"Slurm({', '.join([*shown, f'time={self.time!r}', *login])})"


def job_of(instance: Instance) -> str:
    """The Slurm job id an instance of this provider belongs to."""
    return instance.id.split("-")[1]

