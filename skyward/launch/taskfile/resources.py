"""The ``resources:`` block of a task file, checked into candidate :class:`Resources`.

SkyPilot lets a task name several acceptable machines: an accelerator list (``[A100, H100]``,
tried in order), a set (``{L4:1, A10G:1}``, cheapest first), or whole alternative blocks under
``any_of`` (cheapest first) and ``ordered`` (in order). All of them are expanded here into one
tuple of :class:`Resources`, each a single machine shape with every shared field filled in;
:attr:`Candidates.ordered` says whether their order is the user's or to be decided by price.

What each field does on each provider is in ``docs/task-files.md``; the checks here only say
whether a value is well formed, adding a problem (or a warning, for fields Skyward accepts but
cannot honour anywhere) to the file's :class:`~skyward.launch.taskfile.check.Findings`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skyward.launch.taskfile.check import Findings
from skyward.launch.taskfile import fields
from skyward.launch.taskfile.fields import DISK_TIERS, NETWORK_TIERS, Autostop
from skyward.accelerators import KNOWN, parse_memory_gb

__all__ = ["Candidates", "OTHER_ACCELERATORS", "RESOURCE_KEYS", "Resources", "check_resources"]

#: Accelerator models SkyPilot's catalogs name that no AWS instance type Skyward selects has.
#: They are accepted (a Local pool stands in for them; SSH hosts have what they have) and
#: refused only where a provider must buy one.
OTHER_ACCELERATORS = (
    "A10", "A40", "A100-40GB", "A100-80GB", "A6000", "B100", "B200", "GB200", "GH200", "H100-80GB",
    "H100-MEGA", "Inferentia", "K80", "L40", "M60", "MI100", "MI210", "MI250", "MI250X", "MI300", "MI300X",
    "MI325X", "P100", "P4", "P40", "RTX2080Ti", "RTX3060", "RTX3080", "RTX3090", "RTX4090", "RTX5090",
    "RTX6000", "RTXA4000", "RTXA5000", "RTXA6000", "RTXPRO6000", "Gaudi", "Gaudi2", "HL-205",
)
_CANONICAL = {n.lower(): n for n in (*KNOWN, *OTHER_ACCELERATORS)}
_ACCELERATOR_WORDS = 'a model and a whole count such as "L4:2", "A100-80GB:8" or "H100"'

_CLOUDS = ("aws", "azure", "cudo", "do", "fluidstack", "gcp", "hyperbolic", "ibm", "kubernetes", "k8s",
           "lambda", "nebius", "oci", "paperspace", "primeintellect", "runpod", "scp", "seeweb", "slurm",
           "ssh", "vast", "vsphere", "shadeform", "local", "*")
#: The clouds that name a Skyward provider.
PROVIDER_OF_CLOUD = {"aws": "aws", "ssh": "ssh", "local": "local", "slurm": "slurm"}

RESOURCE_KEYS = (
    "accelerator_args", "accelerators", "any_of", "autostop", "cloud", "cpus", "disk_size", "disk_tier",
    "ephemeral_storage", "image_id", "infra", "instance_type", "job_recovery", "labels", "local_disk",
    "max_hourly_cost", "memory", "network_tier", "ordered", "ports", "priority", "priority_class", "region",
    "spot_recovery", "use_spot", "volumes", "zone",
)
#: Accepted everywhere and honoured nowhere: one warning line each.
_NOT_HONOURED = {
    "network_tier": "not honoured: Skyward picks no network tier (nodes use the instance's own network)",
    "local_disk": "not honoured: Skyward does not choose instances by local disk",
    "ephemeral_storage": "not honoured (SkyPilot's older name for disk_size on Kubernetes)",
    "accelerator_args": "not honoured: its settings are for TPUs, which Skyward does not run",
    "priority": "not honoured: a Kubernetes scheduling setting",
    "priority_class": "not honoured: a Kubernetes scheduling setting",
    "volumes": "not honoured: Skyward attaches no volumes besides the root disk",
    "max_hourly_cost": "not honoured yet: candidates are ranked by price but none is dropped for it",
}


@dataclass(frozen=True)
class Resources:
    """One candidate machine shape (every field a single value)."""

    accelerator: str | None = None
    cpus: str | None = None
    memory: str | None = None
    instance_type: str | None = None
    use_spot: bool = False
    cloud: str | None = None        # as written: 'aws', 'gcp', ...
    provider: str | None = None     # the Skyward provider the cloud names, if any
    region: str | None = None
    zone: str | None = None
    disk_size: int | None = None    # GB
    disk_tier: str | None = None
    ports: tuple[tuple[int, int], ...] = ()
    image_id: str | None = None
    image_by_region: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("accelerators", self.accelerator), ("cpus", self.cpus),
                                            ("memory", self.memory), ("instance_type", self.instance_type)) if v]
        return ", ".join(parts) or "any machine"


@dataclass(frozen=True)
class Candidates:
    """Every acceptable machine shape, and whether their order is the user's (``ordered``)."""

    options: tuple[Resources, ...] = (Resources(),)
    ordered: bool = True
    autostop: Autostop | None = None
    job_recovery: fields.JobRecovery | None = None


def check_resources(raw: Any, found: Findings) -> Candidates:
    """``resources:`` as written -> :class:`Candidates`; problems and warnings go to ``found``."""
    if raw is None:
        return Candidates()
    if not isinstance(raw, Mapping):
        found.problem("resources", "a mapping of resource keys (accelerators, cpus, memory, ...)", raw)
        return Candidates()
    base = _one(raw, "resources", found, top=True)
    alternatives: list[tuple[str, Any]] = []
    for key in ("any_of", "ordered"):
        if key in raw and raw[key] is not None:
            if not isinstance(raw[key], list) or not raw[key]:
                found.problem(f"resources.{key}", "a non-empty list of resource mappings", raw[key])
            else:
                alternatives += [(f"resources.{key}[{i}]", item) for i, item in enumerate(raw[key])]
    if "any_of" in raw and "ordered" in raw:
        found.problem("resources", "any_of or ordered, not both", "both")
    ordered = "any_of" not in raw and not (isinstance(raw.get("accelerators"), Mapping)
                                          or _is_settext(raw.get("accelerators")))
    options: list[Resources] = []
    blocks = [(where, _one(item, where, found, base=raw)) for where, item in alternatives] or [("resources", base)]
    for _, (shape, accelerators) in blocks:
        options += [replace(shape, accelerator=a) for a in accelerators] if accelerators else [shape]
    autostop = fields.parse_autostop(raw.get("autostop"), "resources.autostop", found) if "autostop" in raw else None
    recovery = fields.recovery(raw, found)
    return Candidates(tuple(options) or (Resources(),), ordered, autostop, recovery)


def _one(raw: Any, where: str, found: Findings, *, top: bool = False,
         base: Mapping[str, Any] | None = None) -> tuple[Resources, tuple[str, ...]]:
    """One resources mapping (a whole block, or an any_of/ordered entry over the block's keys)."""
    if not isinstance(raw, Mapping):
        found.problem(where, "a mapping of resource keys", raw)
        return Resources(), ()
    keys = RESOURCE_KEYS if top else tuple(k for k in RESOURCE_KEYS if k not in ("any_of", "ordered"))
    for key in raw:
        if key not in keys:
            found.unknown(f"{where}.", key, keys)
    merged = {**{k: v for k, v in (base or {}).items() if k not in ("any_of", "ordered")}, **raw}
    # The block's own keys were checked when it was read on its own: an entry checks only its
    # keys, so that a problem in the block is reported once.
    own = raw
    at = lambda key: f"{where}.{key}"  # noqa: E731
    for key, text in _NOT_HONOURED.items():
        if key in own and own[key] is not None:
            found.warn(at(key), text)
    if "labels" in own:
        fields.labels(own["labels"], at("labels"), found)
    cloud, provider, region, zone = _placement(merged, where, own, found)
    accelerators = _accelerators(own["accelerators"], at("accelerators"), found) if "accelerators" in own else \
        (_accelerators(merged.get("accelerators"), "resources.accelerators", Findings(found.where))
         if "accelerators" in merged else ())
    shape = Resources(
        cpus=fields.minimum(merged.get("cpus"), at("cpus"), found if "cpus" in own else None),
        memory=fields.minimum(merged.get("memory"), at("memory"), found if "memory" in own else None),
        instance_type=fields.text(merged.get("instance_type"), at("instance_type"),
                                  "an instance type such as g6.xlarge",
                            found if "instance_type" in own else None),
        use_spot=fields.flag(merged.get("use_spot", False), at("use_spot"), found if "use_spot" in own else None),
        cloud=cloud, provider=provider, region=region, zone=zone,
        disk_size=fields.disk_size(merged.get("disk_size"), at("disk_size"), found if "disk_size" in own else None),
        disk_tier=fields.choice(merged.get("disk_tier"), at("disk_tier"), DISK_TIERS,
                                found if "disk_tier" in own else None),
        ports=fields.ports(merged.get("ports"), at("ports"), found if "ports" in own else None),
        image_id=None, image_by_region={},
        labels=dict(merged.get("labels") or {}) if isinstance(merged.get("labels"), Mapping) else {},
    )
    if "network_tier" in own:
        fields.choice(own["network_tier"], at("network_tier"), NETWORK_TIERS, found)
    image_id, by_region = fields.image(merged.get("image_id"), at("image_id"), found if "image_id" in own else None)
    return replace(shape, image_id=image_id, image_by_region=by_region), accelerators


# -- single fields ----------------------------------------------------------------------------


def _is_settext(value: Any) -> bool:
    return isinstance(value, str) and value.strip().startswith("{")


def _accelerators(value: Any, where: str, found: Findings) -> tuple[str, ...]:
    """Every accepted spelling -> candidate strings "NAME:COUNT" (empty: no accelerator)."""
    if value is None:
        return ()
    if isinstance(value, str) and value.strip()[:1] in "{[":  # "{A100:1, V100:1}" written as text
        value = [v for v in re.split(r"[,\s]+", value.strip()[1:-1]) if v]
    if isinstance(value, Mapping):
        items = []
        for name, count in value.items():
            if count is None:
                items.append(str(name))
            elif isinstance(count, (int, float)) and not isinstance(count, bool):
                items.append(f"{name}:{count:g}")
            else:
                found.problem(f"{where}[{name!r}]", "a count (a number) or nothing", count)
        value = items
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        found.problem(where, f'{_ACCELERATOR_WORDS}, or a list or set of them', value)
        return ()
    out = []
    for item in value:
        one = _accelerator(item, where, found)
        if one is not None:
            out.append(one)
    return tuple(out)


def _accelerator(item: Any, where: str, found: Findings) -> str | None:
    if not isinstance(item, str) or not item.strip():
        found.problem(where, _ACCELERATOR_WORDS, item)
        return None
    name, sep, count = item.strip().partition(":")
    name = name.strip()
    if name.lower().startswith("tpu"):
        found.problem(where, "GPUs or AWS accelerators", item,
                      "TPUs are Google Cloud's; Skyward has no provider that runs them")
        return None
    number = 1.0
    if sep:
        try:
            number = float(count)
        except ValueError:
            number = -1.0
        if not number > 0:
            found.problem(where, _ACCELERATOR_WORDS, item, "the count must be a positive whole number")
            return None
        if number != int(number):  # SkyPilot's way to let jobs of one cluster share a device
            whole = math.ceil(number)
            found.warn(where, f"{item.strip()}: a worker has whole devices, so this task gets {whole} "
                              f"(SkyPilot shares a fraction of one between the jobs of a cluster)")
            number = float(whole)
    canonical = _CANONICAL.get(name.lower())
    if canonical is None and "-" in name:  # a memory variant of a known model: A100-80GB
        base, _, memory = name.rpartition("-")
        try:
            parse_memory_gb(memory)
        except ValueError:
            pass
        else:
            canonical = f"{_CANONICAL.get(base.lower(), '')}-{memory.upper()}" if base.lower() in _CANONICAL else None
    if canonical is None:
        found.problem(where, "an accelerator model: one of " + ", ".join(sorted(_CANONICAL.values())), item,
                      f"unknown accelerator {name!r}")
        return None
    return f"{canonical}:{int(number)}"


def _placement(merged: Mapping[str, Any], where: str, own: Mapping[str, Any],
               found: Findings) -> tuple[str | None, str | None, str | None, str | None]:
    cloud = merged.get("cloud")
    region = merged.get("region")
    zone = merged.get("zone")
    infra = merged.get("infra")
    for key, value in (("cloud", cloud), ("region", region), ("zone", zone), ("infra", infra)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            if key in own:
                found.problem(f"{where}.{key}", "a name (a string)", value)
            return None, None, None, None
    if infra is not None:
        if cloud is not None and "infra" in own and "cloud" in own:
            found.problem(f"{where}.infra", "infra, or cloud/region/zone, not both", infra)
        parts = infra.strip().split("/")
        head = parts[0].lower()
        if head in ("kubernetes", "k8s"):
            cloud, region, zone = head, None, None
        else:
            cloud = parts[0]
            region = parts[1] if len(parts) > 1 and parts[1] != "*" else None
            zone = parts[2] if len(parts) > 2 and parts[2] != "*" else None
            if len(parts) > 3 and "infra" in own:
                found.problem(f"{where}.infra", "CLOUD[/REGION[/ZONE]], e.g. aws/us-east-1", infra)
    if cloud is not None:
        cloud = cloud.strip().lower()
        if cloud == "*":
            cloud = None
        elif cloud not in _CLOUDS:
            key = "infra" if infra is not None else "cloud"
            if key in own:
                found.problem(f"{where}.{key}", "a cloud: one of " + ", ".join(c for c in _CLOUDS if c != "*"),
                              infra if infra is not None else cloud)
            cloud = None
    return cloud, PROVIDER_OF_CLOUD.get(cloud or ""), region, zone
