"""Accelerator specs: what a pool asks for when it wants GPUs (or other accelerators).

An :class:`Accelerator` names a model, how many of them each machine needs, and optionally
the minimum memory per device::

    import skyward as sky

    sky.accelerators.A100(count=8, memory="80GB")   # 8 x A100 with 80 GB each
    sky.accelerators.H100(count=8)
    sky.accelerators.L4(count=4)
    sky.accelerators.T4()

Strings are accepted wherever an accelerator is, and are turned into an :class:`Accelerator`
by :func:`parse_accelerator`: ``"A100"``, ``"h100:8"``, ``"L4:4"``, ``"A100-80GB:8"``.

This module is deliberately light: it imports nothing beyond the standard library and
:mod:`skyward.errors`, so importing it never pulls in cloud SDKs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from skyward.errors import ConfigError

__all__ = [
    "KNOWN",
    "A10G",
    "A100",
    "Accelerator",
    "AcceleratorInfo",
    "H100",
    "H200",
    "Inferentia2",
    "L4",
    "L40S",
    "T4",
    "Trainium",
    "V100",
    "parse_accelerator",
    "parse_memory_gb",
]


@dataclass(frozen=True)
class AcceleratorInfo:
    """What Skyward knows about one accelerator model."""

    name: str
    vendor: str
    cuda: bool
    memory_options: tuple[str, ...]  # per-device memory sizes the model is sold with

    @property
    def default_memory(self) -> str:
        return self.memory_options[0]


def _info(name: str, vendor: str, cuda: bool, *memory: str) -> tuple[str, AcceleratorInfo]:
    return name, AcceleratorInfo(name=name, vendor=vendor, cuda=cuda, memory_options=tuple(memory))


#: Every accelerator model Skyward can select instance types for, by canonical name.
KNOWN: Mapping[str, AcceleratorInfo] = MappingProxyType(dict([
    _info("T4", "NVIDIA", True, "16GB"),
    _info("A10G", "NVIDIA", True, "24GB"),
    _info("L4", "NVIDIA", True, "24GB"),
    _info("L40S", "NVIDIA", True, "48GB"),
    _info("V100", "NVIDIA", True, "16GB", "32GB"),
    _info("A100", "NVIDIA", True, "40GB", "80GB"),
    _info("H100", "NVIDIA", True, "80GB"),
    _info("H200", "NVIDIA", True, "141GB"),
    _info("Trainium", "AWS", False, "32GB"),
    _info("Inferentia2", "AWS", False, "32GB"),
]))

_BY_LOWER = {name.lower(): name for name in KNOWN}

_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(?:i?b)?)?\s*$", re.IGNORECASE)
_UNIT_TO_GB = {"k": 1.0 / (1024 * 1024), "m": 1.0 / 1024, "g": 1.0, "t": 1024.0, "": 1.0}


def parse_memory_gb(value: str | int | float) -> float:
    """``"80GB"``, ``"80G"``, ``"80 GiB"``, ``"24gb"``, ``"81920MiB"``, ``80`` -> size in GB.

    GB and GiB are treated alike (the number is kept as written); ``M``/``MB``/``MiB`` divide by
    1024 and ``T``/``TB``/``TiB`` multiply by 1024. A bare number means GB. Raises
    :class:`ValueError` on anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, (int, float)):
        size = float(value)
    elif isinstance(value, str):
        m = _MEMORY_RE.match(value)
        if not m:
            raise ValueError(f"not a memory size: {value!r}")
        size = float(m.group(1)) * _UNIT_TO_GB[(m.group(2) or "").lower()]
    else:
        raise ValueError(f"not a memory size: {value!r}")
    if not size > 0:
        raise ValueError(f"memory size must be positive: {value!r}")
    return size


@dataclass(frozen=True)
class Accelerator:
    """``count`` devices of model ``name`` per machine, optionally with ``memory`` each.

    ``name`` is normalised to the canonical spelling when it is a known model (``"a100"`` ->
    ``"A100"``); unknown names are kept as given (useful for SSH/local pools whose hardware
    Skyward does not select). ``cuda`` says whether the device runs CUDA; left as ``None`` it
    is taken from :data:`KNOWN` (NVIDIA models yes, AWS Trainium/Inferentia no) and defaults to
    ``True`` for unknown names. After construction it is always a ``bool``.
    """

    name: str
    count: int = 1
    memory: str | None = None
    cuda: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("accelerator", "a non-empty accelerator name", self.name)
        name = self.name.strip()
        canonical = _BY_LOWER.get(name.lower(), name)
        object.__setattr__(self, "name", canonical)
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError("accelerator.count", "a positive integer", self.count)
        if self.memory is not None:
            try:
                parse_memory_gb(self.memory)
            except ValueError:
                raise ConfigError("accelerator.memory",
                                  "a per-device memory size such as '80GB', '24G' or '80 GiB'",
                                  self.memory) from None
        if self.cuda is None:
            info = KNOWN.get(canonical)
            object.__setattr__(self, "cuda", info.cuda if info is not None else True)
        elif not isinstance(self.cuda, bool):
            raise ConfigError("accelerator.cuda", "True or False", self.cuda)

    @property
    def memory_gb(self) -> float | None:
        """The requested per-device memory in GB (``"80GB"`` -> ``80.0``), or ``None``."""
        return None if self.memory is None else parse_memory_gb(self.memory)

    @property
    def known(self) -> bool:
        """Whether this is a model listed in :data:`KNOWN`."""
        return self.name in KNOWN

    def __str__(self) -> str:
        text = self.name if self.memory is None else f"{self.name}-{str(self.memory).replace(' ', '')}"
        return f"{text}:{self.count}"


def _constructor(model: str):
    def make(count: int = 1, memory: str | None = None) -> Accelerator:
        return Accelerator(model, count=count, memory=memory)

    info = KNOWN[model]
    make.__name__ = make.__qualname__ = model
    make.__doc__ = (f"``count`` x {info.vendor} {model} per machine "
                    f"(memory per device: {' or '.join(info.memory_options)}).")
    return make


T4 = _constructor("T4")
A10G = _constructor("A10G")
L4 = _constructor("L4")
L40S = _constructor("L40S")
V100 = _constructor("V100")
A100 = _constructor("A100")
H100 = _constructor("H100")
H200 = _constructor("H200")
Trainium = _constructor("Trainium")
Inferentia2 = _constructor("Inferentia2")


def _accepted() -> str:
    return ("an Accelerator, or a string NAME[:COUNT] or NAME-MEMORY[:COUNT] "
            "(e.g. 'A100', 'H100:8', 'A100-80GB:8'; COUNT a positive integer, default 1), "
            f"where NAME is one of {', '.join(KNOWN)} (case-insensitive)")


def parse_accelerator(value: Accelerator | str | None) -> Accelerator | None:
    """Turn ``None``, an :class:`Accelerator`, or a string into an :class:`Accelerator` (or ``None``).

    Accepted strings: ``"A100"``, ``"a100"`` (case-insensitive), ``"H100:8"``,
    ``"A100-80GB:8"``. Unknown models and bad counts raise :class:`~skyward.errors.ConfigError`
    with ``parameter == "accelerator"``.
    """
    if value is None or isinstance(value, Accelerator):
        return value
    if not isinstance(value, str):
        raise ConfigError("accelerator", _accepted(), value)
    text = value.strip()
    name_part, sep, count_part = text.partition(":")
    name_part = name_part.strip()
    count = 1
    if sep:
        count_text = count_part.strip()
        if not re.fullmatch(r"[0-9]+", count_text) or int(count_text) < 1:
            raise ConfigError("accelerator", _accepted(), value,
                              detail=f"count must be a positive integer, got {count_text!r}")
        count = int(count_text)
    memory: str | None = None
    model = _BY_LOWER.get(name_part.lower())
    if model is None and "-" in name_part:
        base, _, mem = name_part.rpartition("-")
        if base.lower() in _BY_LOWER:
            try:
                parse_memory_gb(mem)
            except ValueError:
                raise ConfigError("accelerator", _accepted(), value,
                                  detail=f"{mem!r} is not a memory size such as '80GB'") from None
            model, memory = _BY_LOWER[base.lower()], mem.strip()
    if model is None:
        raise ConfigError("accelerator", _accepted(), value, detail=f"unknown accelerator {name_part!r}")
    return Accelerator(model, count=count, memory=memory)
