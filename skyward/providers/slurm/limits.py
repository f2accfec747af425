"""What a Slurm partition accepts, checked before anything is queued.

Slurm takes a request it can never grant and lets it pend for ever: a job wider than its
partition, a time limit above the partition's ``MaxTime`` (reason ``PartitionTimeLimit``),
more GPUs per node than its nodes have. So the provider reads the partition as Slurm describes
it (``scontrol show partition``, then ``scontrol show node`` for the nodes' ``Gres``) and
refuses such a request first, with a ConfigError naming the parameter, the value, what Slurm
says and what is accepted.

The readings are plain functions of Slurm's text (:func:`seconds`, :func:`gpus`), testable
without a cluster; :func:`check` asks Slurm through :class:`~skyward.providers.slurm.commands.SlurmCommands`.
"""

from __future__ import annotations

import re

from skyward.errors import ConfigError
from skyward.providers.slurm.commands import SlurmCommands

__all__ = ["TIME_FORMATS", "check", "gpus", "seconds"]

#: Slurm's time limit formats (sbatch(1), --time).
TIME_FORMATS = ('"minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", '
                '"days-hours:minutes" or "days-hours:minutes:seconds"')
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})
_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


def seconds(text: str) -> int | None:
    """A Slurm time limit in seconds; None for ``UNLIMITED``/``INFINITE``. ValueError on
    anything else than :data:`TIME_FORMATS`."""
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return None
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = rest.split(":")
    if not all(p.isdigit() for p in [days, *parts]) or not 1 <= len(parts) <= 3:
        raise ValueError(f"not a Slurm time limit: {text!r}")
    numbers = [int(p) for p in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        h, m, s = (numbers + [0, 0])[:3]
    elif len(numbers) == 3:  # hours:minutes:seconds
        h, m, s = numbers
    else:  # minutes[:seconds]
        h, m, s = 0, numbers[0], numbers[1] if len(numbers) == 2 else 0
    return ((int(days) * 24 + h) * 60 + m) * 60 + s


def gpus(gres: str) -> int:
    """GPUs in a node's ``Gres`` (``gpu:2``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    return sum(int(n) for n in _GPU.findall(gres))


def check(commands: SlurmCommands, partition: str | None, time: str, gpus_per_node: int) -> None:
    """Refuse a time limit above the partition's ``MaxTime`` and more GPUs per node than its
    nodes have (ConfigError naming ``time`` or ``accelerator``). A partition Slurm does not
    know is left to ``sbatch`` (which says so, and the provider lists the known ones)."""
    fields = _partition(commands, partition)
    if fields is None:
        return
    name = fields["PartitionName"]
    limit = fields.get("MaxTime", "UNLIMITED")
    most = seconds(limit) if _is_time(limit) else None  # (None: unlimited, or nothing Slurm would write)
    asked = seconds(time)
    if most is not None and (asked is None or asked > most):
        raise ConfigError("time", f"a time limit up to partition {name}'s MaxTime ({limit})", time,
                          detail=f"Slurm says: scontrol show partition {name}: MaxTime={limit}")
    if gpus_per_node:
        nodes = commands.nodes(fields.get("Nodes", ""))
        have = {n: gpus(f.get("Gres", "(null)")) for n, f in nodes.items()}
        best = max(have.values(), default=0)
        if gpus_per_node > best:
            shown = ", ".join(f"{n}: Gres={nodes[n].get('Gres', '(null)')}" for n in sorted(nodes)[:4])
            accepted = (f"at most {best} GPUs per node (the most a node of partition {name} has)" if best
                        else f"no accelerator (no node of partition {name} has a GPU)")
            raise ConfigError("accelerator", accepted, f"{gpus_per_node} GPUs per node",
                              detail=f"Slurm says: {shown}")


def _is_time(text: str) -> bool:
    try:
        seconds(text)
    except ValueError:
        return False
    return True


def _partition(commands: SlurmCommands, name: str | None) -> dict[str, str] | None:
    """The partition ``name`` (None: the default one) as ``scontrol show partition`` says."""
    for fields in commands.partitions():
        if fields["PartitionName"] == name or (name is None and fields.get("Default") == "YES"):
            return fields
    return None
