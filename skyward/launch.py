"""``skyward launch``: run a task file (SkyPilot's task YAML subset) on a pool.

Two steps, as everywhere a plan can be checked without I/O:

* :func:`plan` reads the task file (:mod:`skyward._task_file`), applies the command line's
  overrides and resolves every variable into a frozen :class:`LaunchPlan`; nothing is started.
  ``--dryrun`` prints :meth:`LaunchPlan.describe` and stops there.
* :func:`execute` opens a :class:`~skyward.ComputePool` for the plan, copies the workdir and
  file mounts to every node, runs ``setup`` then ``run`` on every node at once as
  :func:`skyward.shell` commands (output streams live, prefixed by node), and closes the pool
  on every exit path. Its return value is the command's exit status: 0, the failing node's
  exit code (128 + N for a signal N), 1 for any other error, 130 when interrupted.

The workdir is used in place on the Local provider (the nodes are this machine); on other
providers it is packed once, sent to every node as a task argument and unpacked into
``~/.skyward/workdirs/<task id>``. Secrets travel the same way as other variables (inside the
task, over the pool's connection) and are never printed: plans and errors show ``***``.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from skyward.errors import ConfigError

__all__ = ["LaunchPlan", "execute", "plan"]

PROVIDERS = ("local", "ssh", "aws")
#: Refuse to pack a workdir larger than this (it travels in one message to every node).
MAX_WORKDIR_BYTES = 256 << 20
_SKIP = frozenset({".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".venv", "node_modules"})
MASK = "***"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, resolved from the task file and the command line."""

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
    file_mounts: Mapping[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What setup and run see on top of the node's own variables."""
        return {**self.envs, **self.secrets}

    def describe(self) -> str:
        """The plan in a few lines (secrets masked)."""
        lines = [f"task {self.name!r}: {self.nodes} node(s) on {self.provider}"]
        lines.append("  machines: " + self._machines())
        if self.workdir:
            lines.append(f"  workdir: {self.workdir} (synced to every node; setup and run start there)")
        for dest, source in self.file_mounts.items():
            lines.append(f"  file mount: {source} -> {dest}")
        for key, value in self.envs.items():
            lines.append(f"  env {key}={value}")
        for key in self.secrets:
            lines.append(f"  secret {key}={MASK}")
        if self.setup:
            lines.append("  setup:\n" + _indent(self.setup))
        lines.append("  run:\n" + _indent(self.run))
        return "\n".join(lines)

    def _machines(self) -> str:
        wanted = ", ".join(f"{k}={v}" for k, v in (("accelerators", self.accelerator), ("cpus", self.cpus),
                                                   ("memory", self.memory)) if v)
        if self.provider == "local":
            note = f" (asked: {wanted}; the Local provider runs on this machine as is)" if wanted else ""
            return f"{self.nodes} worker process(es) on this machine, no cost{note}"
        if self.provider == "ssh":
            return ", ".join(self.hosts[:self.nodes]) + (f" (asked: {wanted})" if wanted else "")
        return self._aws_machine()

    def _aws_machine(self) -> str:
        from skyward.providers.aws import catalog

        market = "spot" if self.use_spot else "on-demand"
        region = self.region or "the configured region"
        if self.instance_type:
            known = catalog.by_name(self.instance_type)
            what = known.describe() if known else f"{self.instance_type} (price unknown)"
        else:
            from skyward._task_file import parse_minimum

            cpus = parse_minimum(self.cpus, "--cpus")
            memory = parse_minimum(self.memory, "--memory")
            found = catalog.select(catalog.load_catalog(), accelerator=self.accelerator,
                                   vcpus=cpus[0] if cpus else None, memory_gb=memory[0] if memory else None)
            what = found[0].describe() + " (from the bundled catalog; EC2 is asked at launch)"
        return f"{self.nodes} x {what}, {market}, in {region}; approximate us-east-1 on-demand prices"


def plan(
    path: str | os.PathLike[str],
    *,
    num_nodes: int | None = None,
    gpus: str | None = None,
    cpus: str | None = None,
    memory: str | None = None,
    provider: str = "local",
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
    Raises :class:`~skyward.ConfigError` naming the flag or key at fault.
    """
    from skyward._task_file import load_task, parse_minimum
    from skyward.accelerators import parse_accelerator

    environ = os.environ if environ is None else environ
    task = load_task(path)
    if provider not in PROVIDERS:
        raise ConfigError("--provider", "one of " + ", ".join(PROVIDERS), provider)
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1):
        raise ConfigError("--num-nodes", "an integer >= 1", num_nodes)
    if gpus is not None:
        try:
            parse_accelerator(gpus)
        except ConfigError as exc:
            raise ConfigError("--gpus", exc.accepted, gpus, detail=exc.detail) from None
    parse_minimum(cpus, "--cpus")
    parse_minimum(memory, "--memory")
    host_list = tuple(h.strip() for h in hosts if h.strip())
    if provider == "ssh" and not host_list:
        raise ConfigError("--hosts", "the SSH hosts to use with --provider ssh, e.g. user@h1,user@h2", "nothing")
    if provider != "ssh" and host_list:
        raise ConfigError("--hosts", "hosts only with --provider ssh", ",".join(host_list))
    nodes = num_nodes if num_nodes is not None else task.num_nodes
    if provider == "ssh" and nodes > len(host_list):
        raise ConfigError("--num-nodes", f"at most the {len(host_list)} host(s) given with --hosts", nodes)

    envs: dict[str, str | None] = dict(task.envs)
    if env_file is not None:
        envs.update(_read_env_file(env_file))
    for item in env:
        key, value = _assignment(item, "--env", environ, secret=False)
        envs[key] = value
    missing = [k for k, v in envs.items() if v is None]
    if missing:
        raise ConfigError(f"envs[{missing[0]!r}]", f"a value: pass --env {missing[0]}=VALUE (the task file "
                          "leaves it empty)", None)
    found_secrets: dict[str, str | None] = dict(task.secrets)
    for item in secrets:
        key, value = _assignment(item, "--secret", environ, secret=True)
        found_secrets[key] = value
    missing = [k for k, v in found_secrets.items() if v is None]
    if missing:
        raise ConfigError(f"secrets[{missing[0]!r}]", f"a value: pass --secret {missing[0]}=VALUE, or "
                          f"--secret {missing[0]} with it set in your environment", None)

    resources = task.resources
    return LaunchPlan(
        name=task.name or Path(path).stem, provider=provider, nodes=nodes, run=task.run, setup=task.setup,
        hosts=host_list, accelerator=gpus or resources.accelerators, cpus=cpus or resources.cpus,
        memory=memory or resources.memory, use_spot=resources.use_spot, region=resources.region,
        instance_type=resources.instance_type, envs={k: v for k, v in envs.items() if v is not None},
        secrets={k: v for k, v in found_secrets.items() if v is not None},
        workdir=str(Path(task.workdir).expanduser().resolve()) if task.workdir else None,
        file_mounts={dest: str(Path(src).expanduser().resolve()) for dest, src in task.file_mounts.items()},
    )


def _assignment(item: str, flag: str, environ: Mapping[str, str], *, secret: bool) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    key = key.strip()
    if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
        raise ConfigError(flag, "NAME=VALUE or NAME (a variable name: letters, digits and _)",
                          MASK if secret else item)
    if eq:
        return key, value
    if key not in environ:
        raise ConfigError(flag, f"NAME=VALUE, or NAME set in your environment ({key} is not set)", key)
    return key, environ[key]


def _read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("--env-file", "a readable file of NAME=VALUE lines", os.fspath(path),
                          detail=str(exc)) from None
    found = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--env-file line {number}", "NAME=VALUE", line)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[key.strip()] = value
    return found


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


# -- execute -----------------------------------------------------------------------------------


def make_provider(p: LaunchPlan) -> Any:
    """The provider a plan names (``--provider``), configured from its resources."""
    import skyward as sky
    from skyward._task_file import parse_minimum

    if p.provider == "local":
        return sky.Local()
    if p.provider == "ssh":
        return sky.SSH(list(p.hosts[:p.nodes]))
    cpus = parse_minimum(p.cpus, "--cpus")
    memory = parse_minimum(p.memory, "--memory")
    return sky.AWS(region=p.region, instance_type=p.instance_type, vcpus=cpus[0] if cpus else None,
                   memory_gb=memory[0] if memory else None,
                   allocation="spot" if p.use_spot else "on-demand")


def execute(p: LaunchPlan, *, provider: Any = None, console: bool = True, on_event: Any = None,
            err: IO[str] | None = None, cluster: Mapping[str, Any] | None = None, run_setup: bool = True,
            detach_run: bool = False) -> int:
    """Run the plan on a fresh pool, or on a named cluster; returns the exit status (see the
    module docstring).

    ``provider`` replaces the one the plan names (e.g. an ``sky.SSH`` with options the command
    line has no flags for); ``console`` and ``on_event`` are the pool's. ``cluster`` (see
    :func:`skyward.clusters.cli.pool_args`) runs it on a named cluster that stays up: setup only
    when new or changed (never without ``run_setup``); ``detach_run`` starts the run and returns.
    """
    import skyward as sky
    from skyward.errors import CommandFailed, SkywardError

    err = err or sys.stderr
    shape = {"provider": provider or make_provider(p), "nodes": p.nodes, "accelerator": p.accelerator}
    try:
        if cluster is not None:
            from skyward.clusters import cli as clusters

            shape = clusters.pool_args(dict(cluster), shape)
        with sky.ComputePool(**shape, console=console, on_event=on_event) as pool:
            cwd = _sync_files(pool, p)
            if p.setup and run_setup and (cluster is None or clusters.setup_needed(pool, p)):
                sky.shell(p.setup, env=p.env, cwd=cwd) @ pool
                if cluster is not None:
                    clusters.setup_done(pool, p)
            if detach_run:
                logs = clusters.run_detached(pool, p.run, p.env, cwd)
                err.write(f"skyward: the run goes on on cluster {pool.name} (log: {logs[0]} on node 0); "
                          f"follow it with `skyward logs {pool.name}`\n")
            else:
                sky.shell(p.run, env=p.env, cwd=cwd) @ pool
        return 0
    except CommandFailed as exc:
        which = "setup" if p.setup and exc.command == p.setup else "run"
        err.write(f"skyward: {which} failed on node {exc.node}: {exc}\n")
        return exc.exit_code if exc.exit_code > 0 else 128 - exc.exit_code
    except KeyboardInterrupt:
        left = "detached; the cluster stays up" if cluster is not None else "the pool was torn down"
        err.write(f"skyward: interrupted; {left}\n")
        return 130
    except SkywardError as exc:
        err.write(f"skyward: error: {exc}\n")
        return 1


def _sync_files(pool: Any, p: LaunchPlan) -> str | None:
    """Copy the file mounts and the workdir to the nodes; returns the run's directory there
    (without a workdir: this directory on the Local provider, the home directory elsewhere)."""
    local = pool.provider.name == "local"
    for dest, source in p.file_mounts.items():
        blob = _pack(source, f"file_mounts[{dest!r}]")
        task = _unpack(blob, dest, os.path.isdir(source))
        if local:
            task >> pool  # the nodes are this machine: once is enough
        else:
            task @ pool
    if p.workdir is None:
        return None if local else "~"  # (elsewhere the worker's directory is skyward's own)
    if local:
        return p.workdir
    dest = f"~/.skyward/workdirs/{pool.task_id}"
    _unpack(_pack(p.workdir, "workdir"), dest, True) @ pool
    return dest


def _pack(source: str, what: str) -> bytes:
    buffer = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        root = Path(source)
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if any(part in _SKIP for part in path.relative_to(root.parent if root.is_file() else root).parts):
                continue
            if path.is_file() and not path.is_symlink():
                size += path.stat().st_size
                if size > MAX_WORKDIR_BYTES:
                    raise ConfigError(what, f"a directory of at most {MAX_WORKDIR_BYTES >> 20} MiB", source)
                arcname = path.name if root.is_file() else str(path.relative_to(root))
                tar.add(path, arcname=arcname, recursive=False)
    return buffer.getvalue()


def _unpack(blob: bytes, dest: str, is_dir: bool) -> Any:
    import skyward as sky

    return sky.compute(name="unpack files")(_unpack_here)(blob, dest, is_dir)


def _unpack_here(blob: bytes, dest: str, is_dir: bool) -> str:
    """On a node: write the packed files under ``dest`` (a directory, or the file itself),
    each file atomically, so two nodes sharing a home directory never see half a file."""
    import tempfile

    target = Path(os.path.expandvars(os.path.expanduser(dest)))
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            out = target / member.name if is_dir else target
            out.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, member.mode & 0o777)
            os.replace(tmp, out)
    return str(target)
