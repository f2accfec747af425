"""Where a task's nodes come from: the provider, the machine candidates, and what stands in.

:func:`choose` turns a task's candidate :class:`~skyward.launch.taskfile.resources.Resources` and the
command line into the provider and the ordered candidates a launch tries, adding a warning
for every field that provider cannot honour:

* ``--provider`` wins; otherwise a candidate's ``infra``/``cloud`` naming a Skyward provider
  (aws, ssh, slurm: ``slurm/PARTITION``) picks it; a cloud Skyward lacks runs on Local, with a warning naming the field.
* On Local, an accelerator is stood in for: ``L4:2`` runs 2 worker processes per node, and
  ``SKYPILOT_NUM_GPUS_PER_NODE`` is 2 (one warning line). The first candidate is used.
* On AWS, candidates are tried in the user's order (``ordered``, accelerator lists) or
  cheapest first by the catalog's prices (``any_of``, accelerator sets); one whose
  accelerator no instance type has is dropped with a warning.
* ``image_id: docker:IMAGE`` runs setup and run inside that container where docker or podman
  exists (refused on Local when this machine has neither); an AMI is used on AWS.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence

from skyward.launch.blocks import here_document
from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile.resources import Candidates, Resources

__all__ = ["choose", "in_container", "runtime_of"]


def choose(candidates: Candidates, flag_provider: str | None, gpus: str | None, found: Findings,
           where: str = "") -> tuple[str, tuple[Resources, ...], int]:
    """(provider, candidates to try in order, worker processes per node)."""
    from dataclasses import replace

    options = candidates.options
    if gpus is not None:  # --gpus replaces every candidate's accelerator
        replaced: list[Resources] = []
        for option in (replace(o, accelerator=gpus) for o in options):
            if option not in replaced:
                replaced.append(option)
        options = tuple(replaced)
    named = {o.provider for o in options if o.provider}
    foreign = sorted({o.cloud for o in options if o.cloud and not o.provider})
    if flag_provider is not None:
        provider = flag_provider
    elif len(named) == 1 and not foreign:
        provider = named.pop()
    else:
        provider = "local"
        if foreign:
            found.warn(f"{where}resources.infra", f"{', '.join(foreign)} is not a provider Skyward has; "
                       "running on local (choose another with --provider)")
    fitting = tuple(o for o in options if o.provider in (None, provider)) or options
    if provider == "aws":
        fitting = _aws_order(fitting, candidates.ordered, found, where)
    processes = 1
    first = fitting[0] if fitting else Resources()
    if provider == "local":
        _local_warnings(first, fitting, found, where)
        if first.accelerator:
            processes = int(first.accelerator.rsplit(":", 1)[1])
        fitting = (first,)
    if provider == "ssh":
        _ssh_warnings(first, found, where)
        fitting = (first,)
    if provider == "slurm":
        for key in ("disk_size", "disk_tier", "instance_type", "zone", "labels"):
            if getattr(first, key):
                found.warn(f"{where}resources.{key}", "not honoured on Slurm (the nodes are the partition's)")
        if first.use_spot:
            found.warn(f"{where}resources.use_spot", "not honoured on Slurm (nothing is rented)")
        fitting = (first,)
    for option in fitting:
        _image_warnings(option, provider, found, where)
    return provider, fitting, processes


def _local_warnings(first: Resources, options: Sequence[Resources], found: Findings, where: str) -> None:
    if first.accelerator:
        count = first.accelerator.rsplit(":", 1)[1]
        also = f" (the first of {len(options)} candidates)" if len(options) > 1 else ""
        found.warn(f"{where}resources.accelerators", f"{first.accelerator}{also} on Local: {count} worker "
                   f"process(es) per node stand in for the GPUs; SKYPILOT_NUM_GPUS_PER_NODE={count}")
    for key in ("disk_size", "disk_tier", "instance_type", "region", "zone"):
        if getattr(first, key):
            found.warn(f"{where}resources.{key}", "not honoured on Local (the nodes are this machine)")
    if first.use_spot:
        found.warn(f"{where}resources.use_spot", "not honoured on Local (nothing is rented)")
    if first.labels:
        found.warn(f"{where}resources.labels", "not honoured on Local (nothing is rented to label)")


def _ssh_warnings(first: Resources, found: Findings, where: str) -> None:
    for key in ("disk_size", "disk_tier", "instance_type", "region", "zone", "labels"):
        if getattr(first, key):
            found.warn(f"{where}resources.{key}", "not honoured on SSH hosts (the hosts are as they are)")
    if first.use_spot:
        found.warn(f"{where}resources.use_spot", "not honoured on SSH hosts (nothing is rented)")


def _aws_order(options: Sequence[Resources], ordered: bool, found: Findings, where: str) -> tuple[Resources, ...]:
    from skyward.errors import ConfigError
    from skyward.providers.aws import catalog, catalog_cache

    priced: list[tuple[float, int, Resources]] = []
    for index, option in enumerate(options):
        types = catalog_cache.current(option.region)[0]
        if option.instance_type:
            known = next((t for t in types if t.name == option.instance_type), None)
            price = known.price_per_hour if known and known.price_per_hour is not None else float("inf")
        else:
            try:
                best = catalog.select(types, accelerator=option.accelerator)[0]
            except ConfigError:
                found.warn(f"{where}resources.accelerators", f"{option.accelerator}: no AWS instance type has "
                           "it; this candidate is skipped on aws")
                continue
            price = best.price_per_hour if best.price_per_hour is not None else float("inf")
        priced.append((price, index, option))
    if not priced:
        found.problem(f"{where}resources.accelerators", "an accelerator an AWS instance type has: one of "
                      + ", ".join(_aws_accelerators()), [o.accelerator for o in options])
        return tuple(options[:1])
    if not ordered:
        priced.sort(key=lambda item: (item[0], item[1]))
    return tuple(option for _, _, option in priced)


def _aws_accelerators() -> list[str]:
    from skyward.accelerators import KNOWN

    return list(KNOWN)


def _image_warnings(option: Resources, provider: str, found: Findings, where: str) -> None:
    image = option.image_id
    at = f"{where}resources.image_id"
    if option.image_by_region:
        if provider != "aws":
            found.warn(at, f"images by region are not honoured on {provider}")
        return
    if image is None:
        return
    if image.startswith("docker:"):
        if provider == "local" and runtime_of() is None:
            found.problem(at, "docker:IMAGE where docker or podman is installed", image,
                          "neither docker nor podman is on this machine's PATH")
        return
    if image.startswith("skypilot:"):
        found.warn(at, "SkyPilot's own images are not used: AWS nodes start from Skyward's default image "
                       "(the Deep Learning AMI for GPU types, Ubuntu otherwise)" if provider == "aws" else
                   "SkyPilot's own images are not used: the nodes run their own system")
        return
    if provider == "aws":
        if not image.startswith(("ami-", "resolve:ssm:")):
            found.problem(at, "an AMI id (ami-...), resolve:ssm:/PARAMETER, or docker:IMAGE", image)
        return
    found.warn(at, f"not honoured on {provider}: the nodes run their own system")


def runtime_of() -> str | None:
    """docker or podman, whichever this machine has (docker first)."""
    for name in ("docker", "podman"):
        if shutil.which(name):
            return name
    return None


# The container's bash runs its input: read whole, then run with an empty input (as without -i).
_FROM_INPUT = 'eval "$(cat)" </dev/null'


def in_container(command: str, image: str, env_names: Sequence[str], cwd: str | None) -> str:
    """Shell code that runs ``command`` inside ``image`` with docker or podman, whichever the
    node has: host network, the working directory mounted at the same path, the task's and
    the node's variables passed through. The command is the container's input (``-i``: read
    whole, then the command's own input is empty), not an argument of ``docker run``, whose
    command line holds at most 128 KiB per argument (:func:`~skyward.launch.blocks.here_document`)."""
    names = [*env_names, "SKYPILOT_NODE_IPS", "SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES",
             "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_TASK_ID", "SKYWARD_NODE_IPS", "SKYWARD_NODE_RANK",
             "SKYWARD_NUM_NODES", "SKYWARD_NUM_GPUS_PER_NODE", "SKYWARD_TASK_ID", "SKYWARD_HEAD_IP"]
    flags = " ".join(f"-e {shlex.quote(n)}" for n in dict.fromkeys(names))
    gpus = '$([ -e /dev/nvidia0 ] && echo "--gpus all")'
    refusal = shlex.quote(f"skyward: image_id docker:{image} needs docker or podman on the node; neither is "
                          "installed")
    return (f"RT=$(command -v docker || command -v podman) || {{ echo {refusal} >&2; exit 127; }}\n"
            f'exec "$RT" run --rm --network host -i {gpus} {flags} -v "$PWD:$PWD" -w "$PWD" '
            f"{shlex.quote(image)} bash -c {shlex.quote(_FROM_INPUT)} " + here_document(command))
