"""Releasing a pool's AWS resources (step 5 of :mod:`skyward.providers.aws.provider`).

Everything a pool has on AWS carries its tag (``skyward:pool=<pool id>``), so release works from
the tag alone: terminate the instances, confirm it (every one shutting down or terminated),
then delete the key pair and the security group (:func:`inventory.destroy`). That also finds
what a failed or interrupted launch left, whose instances may be known only to AWS, and what
another process launched (a named cluster whose client was killed). Once nothing is left, the
pool's private files (its key, its known_hosts) are deleted too (:func:`destroy`).

:func:`clean_up_failed` runs that after a launch fails, on a thread of its own so that a second
Ctrl-C cannot cut it short, and notes on the launch's error what could not be removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from skyward.errors import ProvisionError
from skyward.providers.aws import ec2 as api
from skyward.providers.aws import inventory, machines
from skyward.providers.aws.launch import PoolState, scratch_prefix
from skyward.providers.base import Instance

__all__ = ["Releasing", "destroy", "remove_files"]


class Releasing:
    """The release half of :class:`~skyward.providers.aws.AWS` (which mixes it in): what this
    process launched (pools, and which pool owns each instance, under one lock) and how it is
    released. The provider's settings and its EC2 client are the provider's own."""

    _lock: threading.Lock
    _pools: dict[str, PoolState]
    _owner: dict[str, str]  # instance id -> pool id
    teardown_timeout: float
    cleanup_settle: float

    def _ec2(self) -> api.EC2:
        raise NotImplementedError

    def _pools_of(self, instances: list[Instance]) -> list[str]:
        """The pools ``instances`` belong to: as this process launched them, else by their tags."""
        with self._lock:
            owners = [self._owner[i.id] for i in instances if i.id in self._owner]
            unknown = [i.id for i in instances if i.id not in self._owner]
        if unknown:
            owners += [_pool_of(item) for item in inventory.instance_states(self._ec2(), unknown).values()]
        return list(dict.fromkeys(p for p in owners if p))

    def _release_pools(self, pool_ids: list[str]) -> None:
        """Release each pool (:meth:`_release_one`), every one tried; raise ProvisionError naming
        what was not released and the command that removes it."""
        problems = []
        for pool_id in pool_ids:
            try:
                left = self._release_one(pool_id)
            except ProvisionError as exc:
                problems.append(str(exc))
                continue
            if not left.empty:
                problems.append(f"pool {pool_id}: not released: {left.describe()}; "
                                f"run `skyward down {pool_id} --region {self._ec2().region}`")
        if problems:
            raise ProvisionError("; ".join(problems), provider="aws")

    def _release_instances(self, instances: list[Instance]) -> None:
        """Terminate just ``instances`` and confirm it; their pools keep everything else."""
        left = inventory.terminate(self._ec2(), [i.id for i in instances], timeout=self.teardown_timeout)
        if left:
            raise ProvisionError(f"could not confirm the termination of {', '.join(left)}", provider="aws")
        gone = {i.id for i in instances}
        with self._lock:
            for pool in self._pools.values():
                pool.instances = [i for i in pool.instances if i.id not in gone]
            for inst in instances:
                self._owner.pop(inst.id, None)

    def _release_one(self, pool_id: str, settle: float = 0.0) -> inventory.PoolResources:
        """Destroy the pool's tagged resources and its private files (:func:`destroy`), and forget
        it once nothing is left; returns what is left."""
        with self._lock:
            pool = self._pools.get(pool_id)
        left = destroy(self._ec2(), pool_id, None if pool is None else pool.directory,
                       timeout=self.teardown_timeout, settle=settle)
        if left.empty:
            with self._lock:
                self._pools.pop(pool_id, None)
                for inst in pool.instances if pool is not None else ():
                    self._owner.pop(inst.id, None)
        return left


    def _clean_up_failed(self, pool: PoolState, error: BaseException) -> None:
        """After a failed or interrupted launch: release the pool (waiting ``cleanup_settle``
        seconds for stragglers when AWS may hold instances no answer named), even through a second
        Ctrl-C; what could not be removed is noted on ``error`` with the command that removes it."""
        outcome: list[Any] = []

        def work() -> None:
            try:
                outcome.append(self._release_one(pool.pool_id,
                                                self.cleanup_settle if pool.launch_in_flight else 0.0))
            except BaseException as exc:  # reported below, on the caller's thread
                outcome.append(exc)

        worker = threading.Thread(target=work, name=f"skyward-aws-cleanup-{pool.pool_id}", daemon=True)
        worker.start()
        for _ in range(3):
            try:
                worker.join()
                break
            except KeyboardInterrupt:
                print(f"skyward: removing the AWS resources of pool {pool.pool_id}, please wait...",
                      file=sys.__stderr__)
        done = outcome[0] if outcome else None
        if isinstance(done, inventory.PoolResources) and done.empty:
            return
        what = done.describe() if isinstance(done, inventory.PoolResources) else repr(done)
        with contextlib.suppress(Exception):
            error.add_note(f"skyward: cleanup of pool {pool.pool_id} incomplete ({what}); "
                           f"run `skyward down {pool.pool_id} --region {pool.plan.region}`")


def destroy(ec2: api.EC2, pool_id: str, directory: str | None, *, timeout: float,
            settle: float) -> inventory.PoolResources:
    """Destroy everything tagged with ``pool_id`` and return what is left (empty on success).
    Once nothing is, delete the pool's private files: ``directory`` ("" for none), or, for a
    pool this process did not launch (``None``), a named cluster's under ``SKYWARD_HOME``.
    ``settle``: seconds to wait before sweeping again, when a launch may still be surfacing."""
    left = inventory.destroy(ec2, pool_id, timeout=timeout, settle=settle)
    if left.empty:
        if directory is None:
            remove_files(pool_id)
        elif directory:
            shutil.rmtree(directory, ignore_errors=True)
    return left


def remove_files(pool_id: str) -> None:
    """Delete the private files (login key, known_hosts) of pool ``pool_id``, once its machines
    are gone, from a process that did not launch it: a named cluster's under ``SKYWARD_HOME``,
    or an unnamed pool's whose client was killed (``skyward down`` on the machine that launched
    it finds that one by its name in the temporary directory)."""
    pattern = os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(scratch_prefix(pool_id)) + "*")
    for directory in [*glob.glob(pattern), str(machines.cluster_directory(pool_id))]:
        shutil.rmtree(directory, ignore_errors=True)


def _pool_of(item: Mapping[str, Any]) -> str:
    """The pool id an EC2 description is tagged with ("" for none)."""
    return inventory._tag(item.get("Tags"), api.TAG_POOL)
