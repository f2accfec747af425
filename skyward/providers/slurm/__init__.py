"""The Slurm provider (:class:`Slurm`): a pool is a Slurm allocation, each worker a job step.

- :mod:`~skyward.providers.slurm.provider`: the :class:`Slurm` class (acquire, reach, losses,
  release);
- :mod:`~skyward.providers.slurm.allocations`: asking for an allocation (``salloc``, then
  ``sbatch``), what a refusal means, cancelling one, and nothing left by a request cut short;
- :mod:`~skyward.providers.slurm.commands`: where Slurm's commands run (this machine, or a
  login node over SSH) and the readings of ``scontrol``;
- :mod:`~skyward.providers.slurm.limits`: what a partition accepts (``MaxTime``, GPUs per
  node), checked before anything is queued.
"""

from skyward.providers.slurm.provider import Slurm

__all__ = ["Slurm"]
