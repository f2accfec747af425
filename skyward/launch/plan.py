"""Planning a launch: the command line checked, each task of the file turned into a stage, and
a stage described as ``--dryrun`` prints it (see :mod:`skyward.launch`).

Every problem goes to the file's :class:`~skyward.launch.taskfile.check.Findings`, so the flags' and the
file's are reported together.
"""

from __future__ import annotations

import os
from dataclasses import replace
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyward.launch.taskfile.fields import describe_ports
from skyward.errors import ConfigError

__all__ = ["MASK", "PROVIDERS", "assignment", "check_flags", "describe_stage", "entrypoint", "read_entry", "read_env_file", "stage", "workdir_flags"]

PROVIDERS = ("local", "ssh", "aws", "slurm")
MASK = "***"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def entrypoint(words: Sequence[str]) -> tuple[str | None, str | None]:
    """What the command line's ENTRYPOINT words are, as SkyPilot decides: ``(task file, None)``
    or ``(None, shell command)``; ``(None, None)`` for none at all. The words are joined with
    spaces. One word ending in ``.yaml``/``.yml`` is a task file (if it cannot be read, the
    plan says so, naming it); so is a readable file holding a YAML mapping; anything else
    (``echo hi``, ``./train.sh``) is a command run on the nodes."""
    import shlex

    text = " ".join(words).strip()
    if not text:
        return None, None
    try:
        single = len(shlex.split(text)) == 1
    except ValueError:  # (unbalanced quotes: not a path)
        single = False
    if single and text.endswith((".yaml", ".yml")):
        return text, None
    if single and os.path.isfile(text):
        try:
            import yaml

            with open(text) as f:
                first = next(iter(yaml.safe_load_all(f)), None)
        except Exception:  # noqa: BLE001 - unreadable or not YAML: a command (a script, say)
            first = None
        if isinstance(first, dict):
            return text, None
    return None, text


def read_entry(path: str | os.PathLike[str] | None, command: str | None) -> tuple[str | None, list[Any], Any]:
    """The pipeline's name, tasks and findings of a task file, or of a command given instead
    (a task whose run block it is; ``None``: a task that runs nothing)."""
    from skyward.launch.taskfile.check import Findings
    from skyward.launch.taskfile.file import read_tasks
    from skyward.launch.taskfile.schema import TaskSpec

    if path is not None:
        return read_tasks(path)
    return None, [TaskSpec(run=command or "", name="command")], Findings("the command line")


def workdir_flags(tasks: list[Any], found: Any, workdir: str | None, git_url: str | None,
                  git_ref: str | None) -> list[Any]:
    """The tasks with ``--workdir`` or ``--git-url``/``--git-ref`` in place of their workdir."""
    from dataclasses import replace

    if workdir is not None and git_url is not None:
        found.problem("--git-url", "either --git-url (a workdir cloned from git) or --workdir (a local "
                      "directory), not both", f"--git-url {git_url} with --workdir {workdir}")
        return tasks
    if git_ref is not None and git_url is None and not all(t.workdir_git for t in tasks):
        found.problem("--git-ref", "--git-ref with --git-url, or with a task file whose workdir is a git "
                      "repository ({url, ref})", git_ref)
        return tasks
    if workdir is not None and not os.path.isdir(os.path.expanduser(workdir)):
        found.problem("--workdir", "a local directory that exists (synced to every node; the run starts there)",
                      workdir)
        return tasks
    changed = []
    for task in tasks:
        if workdir is not None:
            task = replace(task, workdir=workdir, workdir_git=None)
        elif git_url is not None or git_ref is not None:
            url = git_url if git_url is not None else task.workdir_git[0]
            task = replace(task, workdir=None, workdir_git=(url, git_ref))
        changed.append(task)
    return changed


def check_flags(found: Any, provider: str | None, num_nodes: int | None, gpus: str | None, cpus: str | None,
                 memory: str | None, hosts: Sequence[str], infra: str | None = None) -> dict[str, Any]:
    """The command line's values, each bad one added to ``found``. ``infra``: SkyPilot's
    ``--infra PROVIDER[/REGION]`` (``slurm/PARTITION``), in place of ``provider``."""
    from skyward.launch.taskfile.file import parse_minimum
    from skyward.accelerators import parse_accelerator

    def check(fn: Any, *args: Any, flag: str = "") -> Any:
        try:
            return fn(*args)
        except ConfigError as exc:
            found.problem(flag or exc.parameter, exc.accepted, exc.got, exc.detail)
            return None

    if provider is not None and provider not in PROVIDERS:
        found.problem("--provider", "one of " + ", ".join(PROVIDERS), provider)
    region = None
    if infra is not None:
        head, _, region = infra.strip().partition("/")
        if provider is not None:
            found.problem("--infra", "--infra or --provider, not both", infra)
        elif head.lower() not in PROVIDERS or "/" in region:
            found.problem("--infra", "PROVIDER[/REGION] with a provider Skyward has (" + ", ".join(PROVIDERS)
                          + "), e.g. aws/us-east-1 or slurm/PARTITION", infra)
        else:
            provider = head.lower()
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1):
        found.problem("--num-nodes", "an integer >= 1", num_nodes)
        num_nodes = None
    if gpus is not None and check(parse_accelerator, gpus, flag="--gpus") is None:
        gpus = None
    check(parse_minimum, cpus, "--cpus")
    check(parse_minimum, memory, "--memory")
    host_list = tuple(h.strip() for h in hosts if h.strip())
    if provider == "ssh" and not host_list:
        found.problem("--hosts", "the SSH hosts to use with --provider ssh, e.g. user@h1,user@h2", "nothing")
    if provider not in ("ssh", None) and host_list:
        found.problem("--hosts", "hosts only with --provider ssh", ",".join(host_list))
    if gpus is not None:
        gpus = str(parse_accelerator(gpus))
    return {"provider": provider, "nodes": num_nodes, "gpus": gpus, "cpus": cpus, "memory": memory,
            "hosts": host_list, "region": region or None}


def stage(task: Any, where: str, name: str, found: Any, flags: Mapping[str, Any], overrides: Mapping[str, str],
          given_secrets: Mapping[str, str]) -> dict[str, Any]:
    """One task of the file, with the command line applied, as the fields of its
    :class:`~skyward.launch.LaunchPlan`; problems go to ``found``."""
    from skyward.launch.where import choose
    from skyward.launch.taskfile.mounts import resolve

    envs: dict[str, str | None] = {**task.envs, **overrides}
    for key in [k for k, v in envs.items() if v is None]:
        found.problem(f"{where}envs[{key!r}]", f"a value: pass --env {key}=VALUE (the task file leaves it empty)",
                      None)
    found_secrets: dict[str, str | None] = {**task.secrets, **given_secrets}
    for key in [k for k, v in found_secrets.items() if v is None]:
        found.problem(f"{where}secrets[{key!r}]", f"a value: pass --secret {key}=VALUE, or --secret {key} with "
                      "it set in your environment", None)
    values = {k: v for k, v in envs.items() if v is not None}
    workdir, mounts, buckets = resolve(task.workdir, task.file_mounts, values, found, where)
    provider = flags["provider"]
    if provider is None and flags["hosts"]:
        provider = "ssh"
    options = task.candidates
    if flags.get("region"):  # (--infra's REGION part: a Slurm partition, an AWS region)
        options = replace(options, options=tuple(replace(o, region=flags["region"]) for o in options.options))
    provider, candidates, processes = choose(options, provider, flags["gpus"], found, where)
    nodes = flags["nodes"] or task.num_nodes
    hosts = flags["hosts"]
    if provider == "ssh" and not hosts and flags["provider"] is None:
        found.problem(f"{where}resources.infra", "a cloud Skyward can rent from, or --hosts for ssh", "ssh")
    elif provider == "ssh" and nodes > len(hosts) and hosts:
        found.problem("--num-nodes", f"at most the {len(hosts)} host(s) given with --hosts", nodes)
    if provider == "local":
        _local_tools(buckets, found, where)
    first = candidates[0]
    return dict(
        name=name, provider=provider, nodes=nodes, run=task.run, setup=task.setup, hosts=hosts,
        accelerator=first.accelerator, cpus=flags["cpus"] or first.cpus, memory=flags["memory"] or first.memory,
        use_spot=first.use_spot, region=first.region, instance_type=first.instance_type,
        envs=values, secrets={k: v for k, v in found_secrets.items() if v is not None},
        workdir=workdir, workdir_git=task.workdir_git, file_mounts=mounts, processes_per_node=processes,
        candidates=candidates,
        buckets=buckets, autostop=task.candidates.autostop, job_recovery=task.candidates.job_recovery,
    )


def _local_tools(buckets: Sequence[Any], found: Any, where: str) -> None:
    """The Local nodes are this machine: a bucket whose store has no copy tool here is refused
    now, before anything starts, naming the tools."""
    from skyward.launch.taskfile.stores import find_tool

    for bucket in buckets:
        store = bucket.where.store
        if store.scheme != "s3" and not any(find_tool(t) for t in store.copy_tools):
            tools = " or ".join(store.copy_tools)
            found.problem(f"{where}file_mounts[{bucket.dest!r}]", f"{bucket.url.split('://')[0]}:// buckets where "
                          f"{tools} is installed (the Local nodes are this machine)", bucket.url,
                          f"{tools} is not on this machine's PATH")


def describe_stage(self: Any) -> list[str]:
    """One stage of a plan in a few lines (secrets masked)."""
    lines = [f"task {self.name!r}: {self.nodes} node(s) on {self.provider}"]
    lines.append("  machines: " + _machines(self))
    for other in self.candidates[1:]:
        lines.append(f"  then, if AWS has no capacity: {other.describe()}")
    first = self.candidates[0] if self.candidates else None
    if first is not None and self.provider == "aws":
        extra = []
        if first.disk_size or first.disk_tier:
            extra.append(f"root disk {first.disk_size or 100} GB, tier {first.disk_tier or 'medium'}")
        if first.ports:
            extra.append(f"ports {describe_ports(first.ports)} open")
        if first.zone:
            extra.append(f"zone {first.zone}")
        if extra:
            lines.append("  " + ", ".join(extra))
    if self.image:
        lines.append(f"  image: {self.image}")
    if self.autostop is not None:
        lines.append(f"  autostop: after {self.autostop.idle_minutes:g} idle minute(s)"
                     + (", then down" if self.autostop.down else ""))
    if self.job_recovery is not None:
        lines.append(f"  job recovery: {self.job_recovery.describe()}")
    if self.workdir:
        lines.append(f"  workdir: {self.workdir} (synced to every node; setup and run start there)")
    if self.workdir_git:
        url, ref = self.workdir_git
        lines.append(f"  workdir: git {url}{' at ' + ref if ref else ''} (cloned on every node; setup and run "
                     "start there)")
    for dest, source in self.file_mounts.items():
        lines.append(f"  file mount: {source} -> {dest}")
    for bucket in self.buckets:
        lines.append(f"  bucket: {bucket.url} -> {bucket.dest} ({bucket.describe()})")
    for key, value in self.envs.items():
        lines.append(f"  env {key}={value}")
    for key in self.secrets:
        lines.append(f"  secret {key}={MASK}")
    if self.setup:
        lines.append("  setup:\n" + _indent(self.setup))
    lines.append("  run:\n" + _indent(self.run) if self.run.strip() else "  run: (none)")
    return lines

def _machines(self: Any) -> str:
    wanted = ", ".join(f"{k}={v}" for k, v in (("accelerators", self.accelerator), ("cpus", self.cpus),
                                               ("memory", self.memory)) if v)
    if self.provider == "local":
        if self.accelerator:
            return (f"{self.nodes} node(s) x {self.processes_per_node} worker processes on this machine, "
                    f"standing in for {self.accelerator}, no cost")
        note = f" (asked: {wanted}; the Local provider runs on this machine as is)" if wanted else ""
        return f"{self.nodes} worker process(es) on this machine, no cost{note}"
    if self.provider == "slurm":
        where = f"Slurm partition {self.region}" if self.region else "the default Slurm partition"
        per_node = f", {self.accelerator} per node (--gres)" if self.accelerator else ""
        return f"{self.nodes} node(s) of {where}{per_node}, in one allocation"
    if self.provider == "ssh" or self.hosts:  # (an existing cluster's machines, on any provider)
        spares = self.hosts[self.nodes:] if self.job_recovery is not None else ()
        return (", ".join(self.hosts[:self.nodes]) + (f" (asked: {wanted})" if wanted else "")
                + (f"; spare for job recovery: {', '.join(spares)}" if spares else ""))
    return _aws_machine(self)

def _aws_machine(self: Any) -> str:
    from skyward.providers.aws import catalog_cache

    market = "spot" if self.use_spot else "on-demand"
    region = self.region or "the configured region"
    types, source = catalog_cache.current(self.region)
    if self.instance_type:
        known = next((t for t in types if t.name == self.instance_type), None)
        what = known.describe() if known else f"{self.instance_type} (price unknown)"
    else:
        from skyward.launch.taskfile.file import parse_minimum
        from skyward.providers.aws import catalog

        cpus = parse_minimum(self.cpus, "--cpus")
        memory = parse_minimum(self.memory, "--memory")
        found = catalog.select(types, accelerator=self.accelerator,
                               vcpus=cpus[0] if cpus else None, memory_gb=memory[0] if memory else None)
        what = found[0].describe() + " (EC2 is asked at launch)"
    return f"{self.nodes} x {what}, {market}, in {region}\n  prices: {source}"


def assignment(item: str, flag: str, environ: Mapping[str, str], *, secret: bool) -> tuple[str, str]:
    """``--env``/``--secret``'s ``NAME=VALUE`` (or ``NAME``, taken from ``environ``)."""
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


def read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """``--env-file``'s variables: a dotenv file of ``NAME=VALUE`` lines (``export``, quotes and
    comments allowed)."""
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
