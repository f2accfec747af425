"""EC2 instance types: an offline catalog, conversion from the EC2 API, and selection.

The AWS provider normally learns instance specs from ``ec2.describe_instance_types()`` and
turns each item into an :class:`InstanceType` with :func:`from_ec2_description`. When that call
is unavailable (no credentials yet, no network, a restricted IAM policy, tests), the bundled
``catalog.json`` read by :func:`load_catalog` stands in for it.

Prices in the catalog (``price_per_hour``) are **approximate** us-east-1 Linux on-demand list
prices in USD, written down around 2024 from AWS's public price list (the p5 family after
AWS's June 2025 reduction); :mod:`.catalog_cache` builds a current, dated one from AWS's APIs. They are used only to
rank candidates (cheapest first) and are not a quote: AWS changes prices, other regions
differ, and spot / savings-plan prices are not considered. A type with no known price has
``price_per_hour = None`` and is ranked after every priced one.

This module imports no AWS SDK; it only needs the standard library, :mod:`skyward.errors` and
:mod:`skyward.accelerators`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from skyward.accelerators import KNOWN, Accelerator, parse_accelerator
from skyward.errors import ConfigError

__all__ = [
    "DEFAULT_MEMORY_GB",
    "DEFAULT_VCPUS",
    "GPU_MEMORY_TOLERANCE",
    "InstanceType",
    "by_name",
    "from_ec2_description",
    "load_catalog",
    "select",
]

#: CPU-only requests that give no ``vcpus`` / ``memory_gb`` get at least this much.
DEFAULT_VCPUS = 2
DEFAULT_MEMORY_GB = 4.0

#: Per-device memory is compared loosely: vendors sell "24 GB" cards that EC2 reports as
#: 22.35 GiB, so a type qualifies when its per-device memory is at most this fraction below
#: the request.
GPU_MEMORY_TOLERANCE = 0.10

_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "x86-64": "x86_64",
                 "arm64": "arm64", "aarch64": "arm64"}


@dataclass(frozen=True)
class InstanceType:
    """One EC2 instance type.

    ``gpu`` is the accelerator model (an NVIDIA GPU, or AWS Trainium / Inferentia) or ``None``
    for CPU-only types; ``gpu_count`` and ``gpu_memory_gib`` (per device) are ``0`` / ``None``
    exactly when ``gpu`` is ``None``. ``cuda`` says whether the devices run CUDA.
    ``price_per_hour`` is an approximate us-east-1 on-demand USD price, or ``None`` if unknown.
    """

    name: str
    vcpus: int
    memory_gib: float
    gpu: str | None = None
    gpu_count: int = 0
    gpu_memory_gib: float | None = None
    cuda: bool = False
    arch: str = "x86_64"
    price_per_hour: float | None = None

    @property
    def has_accelerator(self) -> bool:
        return self.gpu is not None

    @property
    def accelerator(self) -> Accelerator | None:
        """The devices on one machine of this type, as an :class:`Accelerator` (or ``None``)."""
        if self.gpu is None:
            return None
        memory = None if self.gpu_memory_gib is None else f"{self.gpu_memory_gib:g}GiB"
        return Accelerator(self.gpu, count=self.gpu_count, memory=memory, cuda=self.cuda)

    def describe(self) -> str:
        """A one-line human summary, e.g. ``p4d.24xlarge (96 vCPU, 1152 GiB, 8 x A100 40 GiB, ~$32.77/h)``."""
        parts = [f"{self.vcpus} vCPU", f"{self.memory_gib:g} GiB"]
        if self.gpu is not None:
            mem = "" if self.gpu_memory_gib is None else f" {self.gpu_memory_gib:g} GiB"
            parts.append(f"{self.gpu_count} x {self.gpu}{mem}")
        if self.arch != "x86_64":
            parts.append(self.arch)
        parts.append("price unknown" if self.price_per_hour is None else f"~${self.price_per_hour:.2f}/h")
        return f"{self.name} ({', '.join(parts)})"


# --------------------------------------------------------------------------- catalog

def _from_record(r: Mapping[str, Any]) -> InstanceType:
    price = r.get("price_per_hour")
    gmem = r.get("gpu_memory_gib")
    return InstanceType(
        name=r["name"],
        vcpus=int(r["vcpus"]),
        memory_gib=float(r["memory_gib"]),
        gpu=r.get("gpu"),
        gpu_count=int(r.get("gpu_count") or 0),
        gpu_memory_gib=None if gmem is None else float(gmem),
        cuda=bool(r.get("cuda", False)),
        arch=r.get("arch", "x86_64"),
        price_per_hour=None if price is None else float(price),
    )


@functools.cache
def load_catalog() -> tuple[InstanceType, ...]:
    """The bundled offline catalog (read once, then cached)."""
    text = resources.files("skyward.providers.aws").joinpath("catalog.json").read_text(encoding="utf-8")
    return tuple(_from_record(r) for r in json.loads(text)["instance_types"])


@functools.cache
def _catalog_index() -> Mapping[str, InstanceType]:
    return {t.name: t for t in load_catalog()}


def by_name(name: str) -> InstanceType | None:
    """The catalog entry for ``name`` (e.g. ``"g5.xlarge"``), or ``None``."""
    return _catalog_index().get(name)


# --------------------------------------------------------------------------- EC2 API

def _canonical_model(name: str) -> str:
    for known in KNOWN:
        if known.lower() == name.lower():
            return known
    return name


def from_ec2_description(d: Mapping[str, Any]) -> InstanceType:
    """Build an :class:`InstanceType` from one item of ``describe_instance_types()['InstanceTypes']``.

    GPUs come from ``GpuInfo``; AWS Trainium / Inferentia2 from ``NeuronInfo`` (or, for older
    answers, ``InferenceAcceleratorInfo``). ``cuda`` is true when the GPU manufacturer is NVIDIA.
    The EC2 API does not give prices, so ``price_per_hour`` is taken from the offline catalog
    when it lists the same type name, and is ``None`` otherwise.
    """
    name = d["InstanceType"]
    vcpus = int(d.get("VCpuInfo", {}).get("DefaultVCpus", 0))
    memory_gib = d.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
    archs = list(d.get("ProcessorInfo", {}).get("SupportedArchitectures", []))
    if "x86_64" in archs:
        arch = "x86_64"
    elif "arm64" in archs:
        arch = "arm64"
    else:
        arch = archs[0] if archs else "x86_64"

    devices: list[Mapping[str, Any]] = []
    total_mib = None
    manufacturer_default = ""
    for key, list_key, total_key, default_maker in (
        ("GpuInfo", "Gpus", "TotalGpuMemoryInMiB", ""),
        ("NeuronInfo", "NeuronDevices", "TotalNeuronDeviceMemoryInMiB", "AWS"),
        ("InferenceAcceleratorInfo", "Accelerators", "TotalInferenceMemoryInMiB", "AWS"),
    ):
        info = d.get(key) or {}
        if info.get(list_key):
            devices = list(info[list_key])
            total_mib = info.get(total_key)
            manufacturer_default = default_maker
            break

    gpu = None
    gpu_count = 0
    gpu_memory_gib = None
    cuda = False
    if devices:
        first = devices[0]
        gpu = _canonical_model(str(first.get("Name", "unknown")))
        gpu_count = sum(int(dev.get("Count", 1)) for dev in devices)
        per_mib = (first.get("MemoryInfo") or {}).get("SizeInMiB")
        if per_mib is None and total_mib and gpu_count:
            per_mib = total_mib / gpu_count
        gpu_memory_gib = None if per_mib is None else per_mib / 1024
        cuda = str(first.get("Manufacturer", manufacturer_default)).upper() == "NVIDIA"

    known = by_name(name)
    return InstanceType(
        name=name,
        vcpus=vcpus,
        memory_gib=memory_gib,
        gpu=gpu,
        gpu_count=gpu_count,
        gpu_memory_gib=gpu_memory_gib,
        cuda=cuda,
        arch=arch,
        price_per_hour=None if known is None else known.price_per_hour,
    )


# --------------------------------------------------------------------------- selection

def _price_key(t: InstanceType) -> tuple:
    return (t.price_per_hour is None, t.price_per_hour or 0.0, t.gpu_count, t.vcpus, t.memory_gib, t.name)


def _check_positive(parameter: str, value: object, accepted: str, integer: bool) -> None:
    if value is None:
        return
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not value > 0:
        raise ConfigError(parameter, accepted, value)


def _gpu_offer_summary(types: Iterable[InstanceType]) -> str:
    offers: dict[str, tuple[set[int], set[float]]] = {}
    for t in types:
        if t.gpu is None:
            continue
        counts, mems = offers.setdefault(t.gpu, (set(), set()))
        counts.add(t.gpu_count)
        if t.gpu_memory_gib is not None:
            mems.add(t.gpu_memory_gib)
    if not offers:
        return "no accelerator (none of the candidate instance types has one)"
    parts = []
    for model, (counts, mems) in offers.items():
        text = f"{model}:{'/'.join(str(c) for c in sorted(counts))}"
        if len(mems) > 1:
            text += f" ({' or '.join(f'{m:g}' for m in sorted(mems))} GiB each)"
        parts.append(text)
    return "an accelerator offered by the candidate instance types, as NAME:COUNT: " + ", ".join(parts)


def _normalise_arch(arch: str | None) -> str | None:
    if arch is None:
        return None
    norm = _ARCH_ALIASES.get(str(arch).lower()) if isinstance(arch, str) else None
    if norm is None:
        raise ConfigError("arch", "'x86_64' or 'arm64'", arch)
    return norm


def select(
    candidates: Iterable[InstanceType],
    *,
    accelerator: Accelerator | str | None,
    vcpus: int | None = None,
    memory_gb: float | None = None,
    arch: str | None = None,
) -> list[InstanceType]:
    """The instance types among ``candidates`` that satisfy the request, best first.

    With an ``accelerator`` (an :class:`Accelerator` or a string :func:`parse_accelerator`
    accepts): the device model must match (case-insensitively; ``"A100"`` matches both the
    40 GB and the 80 GB types unless ``memory`` is given, in which case per-device memory must
    be at least that, within :data:`GPU_MEMORY_TOLERANCE`), and the device count per machine
    must be *exactly* ``accelerator.count``. Types with *more* devices are kept too, but ranked
    after every exact match: they satisfy the request while paying for devices nobody asked for.
    ``vcpus`` / ``memory_gb`` (GiB of host memory), if given, are further minimums.

    Without an accelerator: only types with no accelerator at all, having at least ``vcpus``
    (default :data:`DEFAULT_VCPUS`) and ``memory_gb`` (default :data:`DEFAULT_MEMORY_GB`).

    ``arch`` (``"x86_64"`` or ``"arm64"``), if given, filters on CPU architecture.

    Within each group the order is: cheapest ``price_per_hour`` first, unknown prices last, ties
    broken by fewer devices, fewer vCPUs, less memory, then name. Raises
    :class:`~skyward.errors.ConfigError` naming the parameter that cannot be met, and what the
    candidates do offer, when nothing fits.
    """
    acc = parse_accelerator(accelerator)
    _check_positive("vcpus", vcpus, "a positive integer number of vCPUs", integer=True)
    _check_positive("memory_gb", memory_gb, "a positive number of GiB", integer=False)
    want_arch = _normalise_arch(arch)
    pool = list(candidates)

    if want_arch is not None:
        in_arch = [t for t in pool if t.arch == want_arch]
        if not in_arch:
            have = sorted({t.arch for t in pool})
            raise ConfigError("arch", f"one of the architectures offered: {', '.join(have) or 'none'}", arch,
                              detail="no candidate instance type has that CPU architecture")
        pool = in_arch

    if acc is None:
        return _select_cpu(pool, vcpus=vcpus, memory_gb=memory_gb)
    return _select_accelerated(pool, acc, vcpus=vcpus, memory_gb=memory_gb)


def _select_cpu(pool: list[InstanceType], *, vcpus: int | None, memory_gb: float | None) -> list[InstanceType]:
    need_v = DEFAULT_VCPUS if vcpus is None else vcpus
    need_m = DEFAULT_MEMORY_GB if memory_gb is None else memory_gb
    cpu = [t for t in pool if t.gpu is None]
    if not cpu:
        raise ConfigError("accelerator", _gpu_offer_summary(pool), None,
                          detail="no CPU-only instance type among the candidates; ask for an accelerator")
    enough_v = [t for t in cpu if t.vcpus >= need_v]
    if not enough_v:
        top = max(cpu, key=lambda t: (t.vcpus, t.memory_gib))
        raise ConfigError("vcpus", f"at most {top.vcpus} (the largest CPU-only type is {top.describe()})", vcpus,
                          detail=f"no CPU-only instance type has {need_v} vCPUs")
    fits = [t for t in enough_v if t.memory_gib >= need_m]
    if not fits:
        top = max(enough_v, key=lambda t: (t.memory_gib, -t.vcpus))
        raise ConfigError("memory_gb", f"at most {top.memory_gib:g} GiB with {need_v}+ vCPUs "
                                       f"(the largest is {top.describe()})", memory_gb,
                          detail=f"no CPU-only instance type has {need_v}+ vCPUs and {need_m:g} GiB")
    return sorted(fits, key=_price_key)


def _select_accelerated(pool: list[InstanceType], acc: Accelerator, *, vcpus: int | None,
                        memory_gb: float | None) -> list[InstanceType]:
    summary = _gpu_offer_summary(pool)
    same_model = [t for t in pool if t.gpu is not None and t.gpu.lower() == acc.name.lower()]
    if not same_model:
        raise ConfigError("accelerator", summary, str(acc),
                          detail=f"no candidate instance type has {acc.name}")

    want_mem = acc.memory_gb
    if want_mem is not None:
        floor = want_mem * (1.0 - GPU_MEMORY_TOLERANCE)
        with_mem = [t for t in same_model if t.gpu_memory_gib is not None and t.gpu_memory_gib >= floor]
        if not with_mem:
            have = sorted({t.gpu_memory_gib for t in same_model if t.gpu_memory_gib is not None})
            raise ConfigError("accelerator", summary, str(acc),
                              detail=f"{acc.name} is offered with {' or '.join(f'{m:g}' for m in have) or 'unknown'} "
                                     f"GiB per device, not {acc.memory}")
        same_model = with_mem

    enough = [t for t in same_model if t.gpu_count >= acc.count]
    if not enough:
        most = max(t.gpu_count for t in same_model)
        raise ConfigError("accelerator", summary, str(acc),
                          detail=f"at most {most} x {acc.name} per instance type")

    fits = enough
    if vcpus is not None:
        fits = [t for t in fits if t.vcpus >= vcpus]
        if not fits:
            top = max(enough, key=lambda t: t.vcpus)
            raise ConfigError("vcpus", f"at most {top.vcpus} with {acc} ({top.describe()})", vcpus,
                              detail=f"no {acc.name} instance type has {vcpus} vCPUs")
    if memory_gb is not None:
        before = fits
        fits = [t for t in fits if t.memory_gib >= memory_gb]
        if not fits:
            top = max(before, key=lambda t: t.memory_gib)
            raise ConfigError("memory_gb", f"at most {top.memory_gib:g} GiB with {acc} ({top.describe()})",
                              memory_gb, detail=f"no {acc.name} instance type has {memory_gb:g} GiB of memory")

    return sorted(fits, key=lambda t: (t.gpu_count != acc.count, *_price_key(t)))
