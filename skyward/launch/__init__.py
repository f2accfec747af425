"""Task-file runs (``skyward launch``, ``skyward exec``): SkyPilot's task YAML on a pool.

- :mod:`~skyward.launch.run`: :func:`plan` (no I/O) and :func:`execute`;
- :mod:`~skyward.launch.plan`: flags and overrides onto a task; the pool's shape;
- :mod:`~skyward.launch.where`: which provider and machine a task's resources ask for;
- :mod:`~skyward.launch.files`: workdir, file mounts and buckets copied to the nodes;
- :mod:`~skyward.launch.recovery`: job recovery when a node is lost;
- :mod:`~skyward.launch.cluster`: runs on a named cluster (detached, followed, logs);
- :mod:`~skyward.launch.taskfile`: reading and checking the file itself.

Built on pools and clusters; only the CLI imports it.
"""

from __future__ import annotations

from skyward.launch.run import LaunchPlan, execute, make_provider, plan

__all__ = ["LaunchPlan", "execute", "make_provider", "plan"]
