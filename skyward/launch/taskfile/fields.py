"""Single values of a task file's ``resources:`` block, each checked on its own.

Every function takes the value as written and where it is (``resources.any_of[1].ports``), and
returns the value Skyward uses, or ``None`` (or empty) after adding a problem to ``found``;
``found`` is ``None`` when the value was already checked where it was written (an ``any_of``
entry inherits the block's keys, and their problems are reported once).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skyward.launch.taskfile.check import Findings
from skyward.accelerators import parse_memory_gb

__all__ = ["DISK_TIERS", "NETWORK_TIERS", "Autostop", "JobRecovery", "choice", "describe_ports", "disk_size", "flag", "image",
           "labels", "minimum", "parse_autostop", "ports", "recovery", "text"]

DISK_TIERS = ("low", "medium", "high", "ultra", "best")
NETWORK_TIERS = ("standard", "best")


@dataclass(frozen=True)
class Autostop:
    """When an idle named cluster stops itself: after ``idle_minutes`` without work; torn down
    instead of stopped when ``down``. Read by ``skyward launch -c NAME``."""

    idle_minutes: float
    down: bool = False


def minimum(value: Any, where: str, found: Findings | None) -> str | None:
    """cpus / memory: 8, "8", "8+" (at least), 0.5 (rounded up); None: not asked."""
    if value is None:
        return None
    text = str(value).strip() if isinstance(value, (int, float, str)) and not isinstance(value, bool) else ""
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(?:gb|g|gib)?(\+?)", text, re.IGNORECASE)
    if not match or not float(match.group(1)) > 0:
        if found is not None:
            found.problem(where, 'a number such as 8, or "8+" for at least 8', value)
        return None
    return f"{max(1, math.ceil(float(match.group(1))))}{match.group(2)}"


def text(value: Any, where: str, accepted: str, found: Findings | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        if found is not None:
            found.problem(where, accepted, value)
        return None
    return value.strip()


def flag(value: Any, where: str, found: Findings | None) -> bool:
    if not isinstance(value, bool):
        if found is not None:
            found.problem(where, "true or false", value)
        return False
    return value


def choice(value: Any, where: str, choices: tuple[str, ...], found: Findings | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in choices:
        if found is not None:
            found.problem(where, "one of " + ", ".join(choices), value)
        return None
    return value.lower()


def disk_size(value: Any, where: str, found: Findings | None) -> int | None:
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        size = parse_memory_gb(value)
    except ValueError:
        if found is not None:
            found.problem(where, 'a size in GB: 256, or "256GB", "1TB"', value)
        return None
    return max(1, math.ceil(size))


def ports(value: Any, where: str, found: Findings | None) -> tuple[tuple[int, int], ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(item)) if isinstance(item, (int, str)) \
            and not isinstance(item, bool) else None
        low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
        if not (match and 1 <= low <= high <= 65535):
            if found is not None:
                found.problem(where, 'ports 1-65535: 8080, "10000-10010", or a list of them', item)
            continue
        out.append((low, high))
    return tuple(out)


def labels(value: Any, where: str, found: Findings) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        found.problem(where, "a mapping of label names to strings", value)


def image(value: Any, where: str, found: Findings | None) -> tuple[str | None, dict[str, str]]:
    if value is None:
        return None, {}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()) and value:
            return None, dict(value)
        if found is not None:
            found.problem(where, "an image (ami-..., docker:IMAGE), or a mapping {region: image}", value)
        return None, {}
    if not isinstance(value, str) or not value.strip():
        if found is not None:
            found.problem(where, "an image: ami-..., docker:IMAGE, or a mapping {region: image}", value)
        return None, {}
    return value.strip(), {}


_UNIT_MINUTES = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 1440.0, "w": 10080.0}


def parse_autostop(value: Any, where: str, found: Findings) -> Autostop | None:
    """``false`` -> None; ``true`` -> 5 idle minutes; 10 / "10m" / "1h"; or a mapping
    ``{idle_minutes, down, wait_for}``."""
    if value is None or value is False:
        return None
    if value is True:
        return Autostop(5.0)
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(value), re.IGNORECASE)
        if match is None:
            found.problem(where, 'idle minutes (10), a time ("30m", "2h"), true/false, or a mapping '
                          "{idle_minutes, down}", value)
            return None
        return Autostop(float(match.group(1)) * _UNIT_MINUTES[(match.group(2) or "m").lower()])
    if isinstance(value, Mapping):
        keys = ("down", "hook", "hook_timeout", "idle_minutes", "wait_for")
        for key in value:
            if key not in keys:
                found.unknown(f"{where}.", key, keys)
        minutes = value.get("idle_minutes", 5)
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes < 0:
            found.problem(f"{where}.idle_minutes", "a number of minutes >= 0", minutes)
            minutes = 5
        down = value.get("down", False)
        if not isinstance(down, bool):
            found.problem(f"{where}.down", "true or false", down)
            down = False
        if value.get("wait_for") is not None and str(value["wait_for"]).lower() not in ("jobs_and_ssh", "jobs", "none"):
            found.problem(f"{where}.wait_for", "one of jobs_and_ssh, jobs, none", value["wait_for"])
        if "hook" in value:
            found.warn(f"{where}.hook", "not honoured: no command runs before an autostop")
        return Autostop(float(minutes), down)
    found.problem(where, "idle minutes, a time such as \"30m\", true/false, or {idle_minutes, down}", value)
    return None


@dataclass(frozen=True)
class JobRecovery:
    """SkyPilot's ``resources.job_recovery``, as ``skyward launch`` honours it: a node lost (or
    preempted) during the run is replaced and the run restarted on every node, each time; a run
    that fails (a non-zero exit) is restarted up to ``max_restarts_on_errors`` times, and always
    when its exit code is one of ``recover_on_exit_codes``. ``strategy`` is kept as written."""

    strategy: str | None = None
    max_restarts_on_errors: int = 0
    recover_on_exit_codes: tuple[int, ...] = ()

    def describe(self) -> str:
        parts = ["a lost or preempted node is replaced and the run restarted on every node"]
        if self.max_restarts_on_errors:
            parts.append(f"a failed run is restarted up to {self.max_restarts_on_errors} time(s)")
        if self.recover_on_exit_codes:
            codes = ", ".join(str(c) for c in self.recover_on_exit_codes)
            parts.append(f"and always on exit code(s) {codes}")
        return "; ".join(parts)


RECOVERY_KEYS = ("max_restarts_on_errors", "recover_on_exit_codes", "strategy")
RECOVERY_STRATEGIES = ("EAGER_NEXT_REGION", "FAILOVER", "NONE")


def recovery(raw: Mapping[str, Any], found: Findings) -> JobRecovery | None:
    """``job_recovery`` (or its older name ``spot_recovery``): a strategy name, or a mapping
    {strategy, max_restarts_on_errors, recover_on_exit_codes}."""
    for key in ("job_recovery", "spot_recovery"):
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        where = f"resources.{key}"
        if isinstance(value, str):
            value = {"strategy": value}
        if not isinstance(value, Mapping):
            found.problem(where, "a strategy name (FAILOVER, EAGER_NEXT_REGION) or a mapping "
                          "{strategy, max_restarts_on_errors, recover_on_exit_codes}", value)
            return None
        ok = True
        for unknown in sorted(set(map(str, value)) - set(RECOVERY_KEYS)):
            found.unknown(f"{where}.", unknown, RECOVERY_KEYS)
            ok = False
        strategy = value.get("strategy")
        if strategy is not None:
            strategy = str(strategy).upper()
            if strategy not in RECOVERY_STRATEGIES:
                found.problem(f"{where}.strategy", "one of " + ", ".join(RECOVERY_STRATEGIES), value["strategy"])
                ok = False
            elif strategy == "EAGER_NEXT_REGION":
                found.warn(f"{where}.strategy", "EAGER_NEXT_REGION: a replacement comes from the pool's own "
                                                "region (skyward launch does not move a run to another region)")
        restarts = value.get("max_restarts_on_errors", 0)
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            found.problem(f"{where}.max_restarts_on_errors", "a whole number >= 0", restarts)
            ok = False
        codes = value.get("recover_on_exit_codes", ())
        codes = [codes] if isinstance(codes, int) and not isinstance(codes, bool) else codes
        if not isinstance(codes, (list, tuple)) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 0 < c < 256 for c in codes):
            found.problem(f"{where}.recover_on_exit_codes", "a list of exit codes (1 to 255)",
                          value.get("recover_on_exit_codes"))
            ok = False
        if not ok:
            return None
        if strategy == "NONE":
            return None
        return JobRecovery(strategy, restarts, tuple(codes))
    return None


def describe_ports(ports: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ports)

