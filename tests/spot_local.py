"""A Local provider whose machines say they are spot: their workers watch the instance metadata
for notices (at ``AWS_EC2_METADATA_SERVICE_ENDPOINT``: a stand-in, tests/hosts/imds.py), as an
AWS spot node's do. In a module of its own: a named cluster's record keeps its provider, and
any process that reads the record (a dashboard server) imports this."""

from __future__ import annotations

from dataclasses import replace

import skyward as sky
from skyward.providers.base import Instance, PoolSpec


class SpotLocal(sky.Local):
    def provision(self, spec: PoolSpec) -> list[Instance]:
        return [replace(inst, spot=True) for inst in super().provision(spec)]
