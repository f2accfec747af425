"""A launch plan: everything a pool's launch needs, resolved before anything is created."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from skyward.providers.aws import catalog
from skyward.providers.aws import ec2 as api

__all__ = ["LaunchPlan", "MachineImage", "Placement"]


@dataclass(frozen=True, slots=True)
class Placement:
    """A subnet a pool may launch into, and the AZ and VPC it belongs to."""

    subnet_id: str
    zone: str
    vpc_id: str


@dataclass(frozen=True, slots=True)
class MachineImage:
    """A resolved AMI: its id, where it came from, its root device and minimal size."""

    image_id: str
    source: str
    root_device: str | None = None
    min_disk_gb: int = 0


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, resolved without creating anything (see :meth:`AWS.plan`).

    ``candidates`` are the instance types to try, best first; ``zones`` says, per type, the
    AZs that offer it (a type missing from it: every placement); ``images`` maps
    ``(arch, cuda)`` to an AMI; ``types_source`` says whether the types came from the EC2 API
    or the bundled catalog.
    """

    pool_id: str
    nodes: int
    region: str
    candidates: tuple[catalog.InstanceType, ...]
    placements: tuple[Placement, ...]
    markets: tuple[api.Market, ...]
    images: Mapping[tuple[str, bool], MachineImage]
    zones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    types_source: str = "ec2-api"

    @property
    def vpc_id(self) -> str:
        return self.placements[0].vpc_id

    def image_for(self, itype: catalog.InstanceType) -> MachineImage:
        return self.images[(itype.arch, itype.cuda)]

    def attempts(self) -> Iterator[tuple[catalog.InstanceType, Placement, api.Market]]:
        """Launch attempts in order: per type, each market across the AZs that offer the type."""
        for itype in self.candidates:
            offered = self.zones.get(itype.name)
            places = [p for p in self.placements if offered is None or p.zone in offered]
            for market in self.markets:
                for place in places:
                    yield itype, place, market

    def describe(self) -> str:
        """A few human lines: what would be launched where."""
        first = self.candidates[0]
        lines = [f"{self.nodes} x {first.describe()} in {self.region} "
                 f"({' then '.join(self.markets)}; types from {self.types_source})"]
        if len(self.candidates) > 1:
            lines.append("  fallback types: " + ", ".join(t.name for t in self.candidates[1:]))
        lines.append("  zones: " + ", ".join(f"{p.zone} ({p.subnet_id})" for p in self.placements))
        for (arch, cuda), image in sorted(self.images.items()):
            lines.append(f"  image for {arch}{' + CUDA' if cuda else ''}: {image.image_id} ({image.source})")
        return "\n".join(lines)
