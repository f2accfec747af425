"""``skyward launch``: run a task file (SkyPilot's task YAML) on a pool.

Two steps, as everywhere a plan can be checked without I/O:

* :func:`plan` reads the task file (:mod:`skyward.launch.taskfile.file`), applies the command line's
  overrides and resolves every variable into a frozen :class:`LaunchPlan`; nothing is started.
  Every problem in the file and the flags is raised at once
  (:class:`~skyward.launch.taskfile.check.TaskFileError`); fields accepted but not honoured where the
  task runs are the plan's ``warnings``. ``--dryrun`` prints :meth:`LaunchPlan.describe`
  (warnings first) and stops there; a run prints the same plan first.
* :func:`execute` opens a :class:`~skyward.ComputePool` for the plan (trying its machine
  candidates in order while the provider has no capacity), copies the workdir, file mounts and
  buckets to every node, runs ``setup`` then ``run`` on every node at once as
  :func:`skyward.shell` commands (output streams live, prefixed by node), and closes the pool
  on every exit path. A pipeline's stages run one after another, each on its own pool, stopping
  at the first failure. Its return value is the command's exit status: 0, the failing node's
  exit code (128 + N for a signal N), 1 for any other error, 130 when interrupted.

On Local an accelerator is stood in for: ``L4:2`` gives each node 2 worker processes and
``SKYPILOT_NUM_GPUS_PER_NODE=2`` (see :mod:`skyward.launch.where`). The workdir is used in place on the Local provider (the nodes are this machine); on other
providers it is packed once, sent to every node as a task argument and unpacked into
``~/.skyward/workdirs/<task id>``. Secrets travel the same way as other variables (inside the
task, over the pool's connection) and are never printed: plans and errors show ``***``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from skyward.launch.plan import PROVIDERS, assignment, read_env_file  # noqa: F401  (PROVIDERS: --provider)
from skyward.errors import ConfigError

if TYPE_CHECKING:
    from skyward.events import Event
    from skyward.launch.cluster import Follow
    from skyward.launch.taskfile.fields import Autostop, JobRecovery
    from skyward.launch.taskfile.mounts import BucketMount
    from skyward.launch.taskfile.resources import Resources
    from skyward.pool.pool import ComputePool
    from skyward.providers.base import Provider

__all__ = ["LaunchPlan", "execute", "plan"]



@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, resolved from the task file and the command line.

    A pipeline (a file of several tasks) is its first task's plan with the others in ``then``;
    ``warnings`` are the file's (one line per field accepted but not honoured here).
    """

    name: str
    provider: str
    nodes: int
    run: str
    setup: str | None = None
    hosts: tuple[str, ...] = ()
    accelerator: str | None = None
    cpus: str | None = None
    memory: str | None = None
    use_spot: bool = False
    region: str | None = None
    instance_type: str | None = None
    envs: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    workdir: str | None = None
    workdir_git: tuple[str, str | None] | None = None
    file_mounts: Mapping[str, str] = field(default_factory=dict)
    #: Worker processes per node: on Local, the accelerator count asked for (they stand in for it).
    processes_per_node: int = 1
    #: The machine shapes to try, in order (the first is the one above); see skyward.launch.where.
    candidates: tuple[Resources, ...] = ()
    buckets: tuple[BucketMount, ...] = ()
    #: SkyPilot's resources.autostop, for named clusters (idle minutes and down), or None.
    autostop: Autostop | None = None
    #: SkyPilot's resources.job_recovery (lost nodes replaced, failed runs restarted), or None.
    job_recovery: JobRecovery | None = None
    warnings: tuple[str, ...] = ()
    then: tuple[LaunchPlan, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """What setup and run see on top of the node's own variables."""
        return {**self.envs, **self.secrets}

    @property
    def stages(self) -> tuple[LaunchPlan, ...]:
        """This task and the pipeline's following ones, in the order they run."""
        return (self, *self.then)

    @property
    def image(self) -> str | None:
        return self.candidates[0].image_id if self.candidates else None

    def describe(self) -> str:
        """The plan in a few lines (secrets masked), warnings first."""
        from skyward.launch.plan import describe_stage

        lines = [f"warning: {w}" for w in self.warnings]
        for number, stage in enumerate(self.stages, 1):
            if self.then:
                lines.append(f"pipeline stage {number} of {len(self.stages)} (runs after the one before succeeds):")
            lines += describe_stage(stage)
        return "\n".join(lines)

def plan(
    path: str | os.PathLike[str] | None,
    *,
    command: str | None = None,
    workdir: str | None = None,
    git_url: str | None = None,
    git_ref: str | None = None,
    num_nodes: int | None = None,
    gpus: str | None = None,
    cpus: str | None = None,
    memory: str | None = None,
    provider: str | None = None,
    infra: str | None = None,
    hosts: Sequence[str] = (),
    env: Sequence[str] = (),
    env_file: str | os.PathLike[str] | None = None,
    secrets: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """Read ``path`` and apply the command line's overrides (flags win over the file).

    ``env`` items are ``K=V`` (or ``K``: the value is taken from ``environ``, default
    ``os.environ``); ``env_file`` holds ``K=V`` lines (``#`` comments, blank lines); ``secrets``
    items are ``K=V`` or ``K`` likewise. A variable the file leaves null must be given.
    ``provider`` None: the one the file's ``infra`` names (or ``infra``, SkyPilot's
    ``--infra PROVIDER[/REGION]``, ``slurm/PARTITION``), else Local. ``path`` None: the task
    is ``command`` (its run block; None: a task that runs nothing, to bring a cluster up).
    ``workdir`` (a local directory) or ``git_url``/``git_ref`` (a repository cloned on every
    node) replace the task's workdir.
    Raises :class:`~skyward.launch.taskfile.check.TaskFileError` (a :class:`~skyward.ConfigError`) listing
    every problem in the file and the flags at once.
    """
    from skyward.launch.plan import check_flags, read_entry, stage, workdir_flags

    environ = os.environ if environ is None else environ
    title, tasks, found = read_entry(path, command)
    tasks = workdir_flags(tasks, found, workdir, git_url, git_ref)
    flags = check_flags(found, provider, num_nodes, gpus, cpus, memory, hosts, infra)
    overrides: dict[str, str] = {}
    if env_file is not None:
        overrides.update(read_env_file(env_file))
    for item in env:
        key, value = assignment(item, "--env", environ, secret=False)
        overrides[key] = value
    given_secrets = dict(assignment(item, "--secret", environ, secret=True) for item in secrets)
    stages = []
    for number, task in enumerate(tasks, 1):
        where = f"task {number}: " if len(tasks) > 1 else ""
        stem = Path(path).stem if path is not None else "command"
        default = task.name or (f"{title or stem}-{number}" if len(tasks) > 1 else stem)
        stages.append(LaunchPlan(**stage(task, where, default, found, flags, overrides, given_secrets)))
    found.raise_problems()
    first = stages[0]
    return replace(first, warnings=tuple(found.warnings), then=tuple(stages[1:]))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


# -- execute -----------------------------------------------------------------------------------


def make_provider(p: LaunchPlan, candidate: Resources | None = None) -> Provider:
    """The provider a plan names, configured from its resources (``candidate``: one of
    ``p.candidates``, default the first)."""
    from skyward.launch.taskfile.file import parse_minimum
    from skyward.providers.aws import AWS
    from skyward.providers.local import Local
    from skyward.providers.ssh import SSH

    if p.provider == "local":
        return Local()
    if p.provider == "ssh":  # (the hosts beyond num_nodes are spares for job recovery)
        return SSH(list(p.hosts if p.job_recovery is not None else p.hosts[:p.nodes]))
    c = candidate if candidate is not None else (p.candidates[0] if p.candidates else None)
    if p.provider == "slurm":  # (infra: slurm/PARTITION)
        from skyward.providers.slurm import Slurm

        return Slurm(partition=(c.region if c is not None else None) or p.region)
    cpus = parse_minimum(p.cpus if c is None else (c.cpus or p.cpus), "--cpus")
    memory = parse_minimum(p.memory if c is None else (c.memory or p.memory), "--memory")
    extra: dict[str, Any] = {}
    if c is not None:
        region = c.region or p.region
        image = c.image_by_region.get(region or "", None) if c.image_by_region else c.image_id
        if image and image.startswith(("ami-", "resolve:ssm:")):
            extra["ami"] = image
        if c.disk_size:
            extra["disk_gb"] = max(8, c.disk_size)
        extra.update(disk_tier=c.disk_tier, ports=c.ports, zone=c.zone, labels=dict(c.labels))
        return AWS(region=region, instance_type=c.instance_type, vcpus=cpus[0] if cpus else None,
                       memory_gb=memory[0] if memory else None,
                       allocation="spot" if c.use_spot else "on-demand", **extra)
    return AWS(region=p.region, instance_type=p.instance_type, vcpus=cpus[0] if cpus else None,
                   memory_gb=memory[0] if memory else None,
                   allocation="spot" if p.use_spot else "on-demand")


def execute(p: LaunchPlan, *, provider: Provider | None = None, console: bool = True,
            on_event: Callable[[Event], None] | None = None,
            err: IO[str] | None = None, cluster: Mapping[str, Any] | None = None, run_setup: bool = True,
            detach_run: bool = False, progress: list[Any] | None = None) -> int:
    """Run the plan on a fresh pool (each stage of a pipeline on its own, in order, stopping at
    the first that fails), or on a named cluster; returns the exit status (see the module
    docstring).

    ``provider`` replaces the one the plan names (e.g. an ``sky.SSH`` with options the command
    line has no flags for); ``console`` and ``on_event`` are the pool's. ``cluster`` (see
    :func:`skyward.launch.cluster.pool_args`) runs it on a named cluster that stays up: setup only
    when new or changed (never without ``run_setup``); ``detach_run`` starts the run and returns
    (with ``cluster`` only: :class:`~skyward.ConfigError` without one, before anything starts).
    ``progress`` (a list, filled in place) says how far it got: ``[phase]`` or ``[phase, job id]``,
    the phase ``"provision"``, ``"setup"`` or ``"run"`` (the managed jobs' controller tells a
    refused provisioning and a failed setup from a failed run by it).
    """
    if detach_run and cluster is None:
        from skyward.runtime.cluster import DETACHED_NEEDS

        raise ConfigError("detach_run", DETACHED_NEEDS, detach_run, detail="no cluster was given")
    err = err or sys.stderr
    if cluster is not None and any(s.job_recovery is not None for s in p.stages):
        err.write("skyward: resources.job_recovery is not used on a named cluster (-c): a lost node of a cluster "
                  "is not replaced; launch without -c to have the run recovered\n")
    if cluster is not None and len(p.stages) > 1:
        refused = ConfigError("-c", "a task file of one task (a pipeline runs each task on a fresh pool: run its "
                              "tasks one by one to use a cluster)", f"a pipeline of {len(p.stages)} tasks")
        err.write(f"skyward: error: {refused}\n")
        return 2
    for number, stage in enumerate(p.stages, 1):
        code = _execute_stage(stage, provider=provider, console=console, on_event=on_event, err=err,
                              cluster=cluster, run_setup=run_setup, detach_run=detach_run,
                              phase=[] if progress is None else progress)
        if code:
            if p.then:
                err.write(f"skyward: pipeline stopped at stage {number} of {len(p.stages)} ({stage.name})\n")
            return code
    return 0


def _execute_stage(p: LaunchPlan, *, provider: Provider | None, console: bool,
                   on_event: Callable[[Event], None] | None, err: IO[str],
                   cluster: Mapping[str, Any] | None = None, run_setup: bool = True, detach_run: bool = False,
                   phase: list[Any]) -> int:
    from skyward.errors import CapacityError, CommandFailed, SkywardError
    from skyward.image import Image
    from skyward.pool import ComputePool

    attempts: list[Resources | None] = [*p.candidates] or [None]
    phase[:] = ["provision"]
    try:
        for index, candidate in enumerate(attempts):
            accelerator = candidate.accelerator if candidate is not None else p.accelerator
            # (attached to a cluster as it is, `exec`, the pool takes the cluster's own provider: none is made)
            made = None if (cluster or {}).get("attach_only") else provider or make_provider(p, candidate)
            # Remote nodes copy buckets with boto3 (S3) or a store's own tool: their environment gets it.
            pip = tuple(sorted({name for b in p.buckets for name in b.where.store.pip}))
            image = Image(pip=pip) if pip and made is not None and made.name != "local" else None
            shape: dict[str, Any] = {"provider": made, "nodes": p.nodes, "image": image,
                     "accelerator": None if p.provider == "local" else accelerator,
                     "processes_per_node": p.processes_per_node}
            if p.job_recovery is not None and cluster is None:
                # A lost node is replaced (the run restarts: _launch_recovery); a pool of (n, n)
                # nodes also takes its replacements from SSH hosts beyond the first n.
                shape["nodes"] = (p.nodes, p.nodes)
            if cluster is not None:
                from skyward.launch import cluster as clusters

                shape = clusters.pool_args(dict(cluster), shape)
            follow = clusters.Follow(str(cluster["name"]), err) if cluster is not None and not detach_run else None
            try:
                with contextlib.ExitStack() as stack:
                    try:  # entering provisions: a refusal for capacity moves on to the next candidate
                        pool = stack.enter_context(ComputePool(**shape, console=console, on_event=on_event))
                    except CapacityError as exc:
                        following = attempts[index + 1] if index + 1 < len(attempts) else None
                        if candidate is None or following is None:
                            raise
                        err.write(f"skyward: no capacity for {candidate.describe()}: {exc}; trying "
                                  f"{following.describe()}\n")
                        continue
                    phase[0] = "setup"
                    _run_stage(pool, p, phase, cluster=cluster, run_setup=run_setup, detach_run=detach_run, err=err,
                               follow=follow)
            except BaseException:
                if follow is not None:  # (a follow begun ends with its connections)
                    follow.close()
                raise
            return follow.end() if follow is not None else 0
        return 1
    except CommandFailed as exc:
        err.write(f"skyward: {phase[0]} failed on node {exc.node}: {exc}\n")
        return exc.exit_code if exc.exit_code > 0 else 128 - exc.exit_code
    except KeyboardInterrupt:  # (a job submitted to the cluster and followed goes on, whenever this comes)
        left = "detached; the cluster stays up" if cluster is not None else "the pool was torn down"
        if cluster is not None and len(phase) > 1 and not detach_run:
            name, job = cluster["name"], phase[1]
            left = f"stopped following job {job}; it goes on on cluster {name} (`skyward logs {name} {job}`, " \
                   f"`skyward cancel {name} {job}`)"
            err.write(f"skyward: {left}\n")
        else:
            err.write(f"skyward: interrupted; {left}\n")
        return 130
    except SkywardError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 1


def _run_stage(pool: ComputePool, p: LaunchPlan, phase: list[Any], *, cluster: Mapping[str, Any] | None = None,
               run_setup: bool = True, detach_run: bool = False, err: IO[str] | None = None, follow: Follow | None = None) -> None:
    from skyward.launch.files import unmount_all

    mounted: list[str] = []  # the buckets mounted on the nodes: unmounted on every exit path
    try:
        _run_stage_body(pool, p, phase, mounted, cluster=cluster, run_setup=run_setup, detach_run=detach_run,
                         err=err or sys.stderr, follow=follow)
    finally:
        if mounted and cluster is None:  # (a cluster's job may still use them)
            unmount_all(pool, mounted, err or sys.stderr)


def _run_stage_body(pool: ComputePool, p: LaunchPlan, phase: list[Any], mounted: list[str], *,
                     cluster: Mapping[str, Any] | None, run_setup: bool, detach_run: bool, err: IO[str],
                     follow: Follow | None = None) -> None:
    from skyward._shell import shell
    from skyward.launch.blocks import login_shell, on_first
    from skyward.launch.files import sync_files
    from skyward.launch.where import in_container

    cwd = sync_files(pool, p, mounted, err)
    env = dict(p.env)
    if pool.provider.name == "local" and "PATH" not in env:
        # The nodes run this interpreter: its environment's tools (torchrun) come first, as on
        # a remote node whose worker environment is on PATH, without activating anything.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    image = p.image or ""
    # Nodes' setup and run read ~/.bashrc as SkyPilot's do; Local's node is this machine, set up
    # already: the user's shell start-up (pyenv's shims before this interpreter) stays out.
    plain: Callable[[str], str] = (lambda cmd: cmd) if pool.provider.name == "local" else login_shell
    wrap = (lambda cmd: in_container(cmd, image[len("docker:"):], list(env), cwd)) \
        if image.startswith("docker:") else plain
    run_wrap = wrap
    if cluster is not None:
        from skyward.launch import cluster as clusters

        cwd = clusters.run_directory(pool, p, cwd)
        # A task of fewer nodes than the cluster runs on its first ones (setup on every node).
        run_on = clusters.run_on(pool, p.nodes)
        if run_on is not None:
            run_wrap = lambda cmd: on_first(run_on, wrap(cmd))  # noqa: E731
    setup = p.setup if p.setup and run_setup and (
        cluster is None or not cluster.get("fast") or clusters.setup_needed(pool, p)) else None
    if cluster is not None:  # setup runs inside the job (SETTING_UP, FAILED_SETUP), as SkyPilot's
        if setup is not None or p.run.strip():
            job = clusters.submit_job(pool, p, run_wrap(p.run), env, cwd, setup=wrap(setup) if setup else None,
                                      numbered=follow.starter(pool, setup is not None) if follow else None)
            phase += [job, setup is not None]  # (followed from its numbering on: see _execute_stage)
            if setup is not None:
                clusters.setup_done(pool, p)  # (undone when the followed job ends FAILED_SETUP)
            print(f"Job ID: {job}", flush=True)
            if follow is not None:
                follow.queued()
            if detach_run:
                err.write(f"skyward: job {job} goes on on cluster {pool.name}; follow it with "
                          f"`skyward logs {pool.name} {job}`\n")
        return
    if setup is not None:
        shell(wrap(setup), env=env, cwd=cwd) @ pool
    phase[0] = "run"
    if p.run.strip():
        from skyward.launch.recovery import only_on, run_with_recovery

        def prepare(new_nodes: set[int]) -> None:  # after a replacement: files and setup on the new nodes
            if not new_nodes:
                return
            phase[0] = "setup"
            sync_files(pool, p, mounted, err, only=frozenset(new_nodes))
            if p.setup:
                shell(only_on(new_nodes, wrap(p.setup)), env=env, cwd=cwd) @ pool
            phase[0] = "run"

        recovery = p.job_recovery

        def run() -> None:
            shell(run_wrap(p.run), env=env, cwd=cwd) @ pool

        run_with_recovery(pool, recovery, run, prepare, err)
