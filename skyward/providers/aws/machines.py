"""A named cluster's machines on EC2: their states, stopping them (disks kept) and starting
them again. The provider's ``stop``, ``start`` and ``machine_states`` delegate here.

A **named cluster** (``PoolSpec.cluster``) outlives its client, so its provider is pickled into the
cluster's record and used again by other processes (``skyward stop``, ``start``, ``down``, the next
pool that attaches): everything after the launch works from the instances' ids and the pool's tag
alone, and the pool's private key lives under ``SKYWARD_HOME`` (not a temporary directory). Its
instances power off into *stop* (:func:`~skyward.providers.aws.watchdog.power_off_policy`;
terminate when its autostop is a teardown), have no hard lifetime unless ``max_lifetime`` is given,
and stay up while the cluster's resident workers touch the watchdog's heartbeat file
(:attr:`~skyward.providers.aws.provider.AWS.heartbeat_file`): autostop on AWS is the workers
ending, then the watchdog powering the machine off. :func:`stop`, :func:`start` and
:func:`states_of` serve ``skyward stop``/``start``/``status``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from skyward._home import home
from skyward._retry import Backoff
from skyward.errors import ProvisionError
from skyward.providers.aws import ec2 as api
from skyward.providers.aws import inventory
from skyward.providers.aws.keys import write_private
from skyward.providers.base import Instance

__all__ = ["cluster_directory", "described_again", "start", "states_of", "stop", "stop_refusal"]


def states_of(ec2: Any, instances: list[Instance]) -> list[str]:
    """Each instance's EC2 state, or ``"missing"`` for one EC2 no longer knows."""
    states = inventory.instance_states(ec2, [i.id for i in instances])
    return [_state(states, i.id) for i in instances]


def stop(ec2: Any, instances: list[Instance], timeout: float) -> None:
    """Stop the instances (disks kept, compute no longer billed) and confirm it. Raises
    ProvisionError for spot instances (one-time spot requests cannot stop: end such a
    cluster with ``skyward down``), or when they are not stopped within ``timeout`` seconds."""
    ids = [i.id for i in instances]
    refusal = stop_refusal(ec2, instances)
    if refusal:
        raise ProvisionError(refusal, provider="aws")
    states: Mapping[str, Any] = {}
    for _ in Backoff(timeout=timeout, delay=0.2, max_delay=3.0):
        states = inventory.instance_states(ec2, ids)
        running = [i for i in ids if _state(states, i) == "running"]
        if running:
            ec2.call("stop_instances", {"InstanceIds": running})
        elif all(_state(states, i) in ("stopped", *api.GONE_STATES, "missing") for i in ids):
            return
    raise ProvisionError(f"instances not stopped after {timeout:g}s: "
                         + ", ".join(f"{i} ({_state(states, i)})" for i in ids), provider="aws")


def stop_refusal(ec2: Any, instances: list[Instance]) -> str | None:
    """Why the instances cannot be stopped (spot ones: EC2 one-time spot requests cannot), or None."""
    states = inventory.instance_states(ec2, [i.id for i in instances])
    spot = [i.id for i in instances if states.get(i.id, {}).get("InstanceLifecycle") == "spot"]
    if not spot:
        return None
    return (f"{', '.join(spot)}: spot instances cannot be stopped (EC2 one-time spot requests); end the "
            "cluster with `skyward down`, or launch it with allocation='on-demand' to stop and start it")


def start(ec2: Any, instances: list[Instance], timeout: float) -> dict[str, Any]:
    """Start stopped instances again (stopping ones once stopped), wait until each runs, and
    return their EC2 descriptions (see :func:`described_again`). Raises ProvisionError
    when one is gone (terminated) or not running within ``timeout`` seconds."""
    ids = [i.id for i in instances]
    states: dict[str, Any] = {}
    for _ in Backoff(timeout=timeout, delay=0.2, max_delay=3.0):
        states = dict(inventory.instance_states(ec2, ids))
        gone = [f"{i} ({_state(states, i)})" for i in ids
                if _state(states, i) in (*api.GONE_STATES, "missing")]
        if gone:
            raise ProvisionError(f"the cluster's machines are gone: {', '.join(gone)}; end it with "
                                 "`skyward down NAME`", provider="aws")
        stopped = [i for i in ids if _state(states, i) == "stopped"]
        if stopped:
            ec2.call("start_instances", {"InstanceIds": stopped})
        elif all(_state(states, i) == "running" and states[i].get("PrivateIpAddress") for i in ids):
            break
    else:
        raise ProvisionError(f"instances not running after {timeout:g}s: "
                             + ", ".join(f"{i} ({_state(states, i)})" for i in ids), provider="aws")
    return states


def described_again(instances: list[Instance], states: Mapping[str, Any], connect_address: Any, *,
                    rewrite_known_hosts: bool) -> list[Instance]:
    """The instances as they are after a restart: the same ids and node numbers, the pool's key
    and host key, and their addresses now (a public address changes across a stop)."""
    moved: dict[str, list[str]] = {}  # a known_hosts file made for the pool -> its addresses now
    again = []
    for inst in instances:
        item = states[inst.id]
        private, public = item.get("PrivateIpAddress") or "", item.get("PublicIpAddress") or None
        ssh = inst.ssh
        if ssh is not None:
            ssh = replace(ssh, host=connect_address(inst.id, private, public))
            if rewrite_known_hosts:
                for path in ssh.known_hosts:
                    moved.setdefault(path, []).append(ssh.host)
        again.append(replace(inst, private_addr=private, public_addr=public, ssh=ssh))
    for path, addresses in moved.items():
        _rewrite_known_hosts(path, addresses)
    return again


def _state(states: Mapping[str, Any], instance_id: str) -> str:
    return str(states.get(instance_id, {}).get("State", {}).get("Name") or "missing")


def cluster_directory(pool_id: str, *, create: bool = False) -> Path:
    """Where a named cluster's pool keeps its private key and known_hosts: under
    ``SKYWARD_HOME`` (0700), so that later processes, after a reboot too, still log in."""
    path = home() / "aws" / pool_id
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
    return path


def _rewrite_known_hosts(path: str, addresses: Sequence[str]) -> None:
    """Point the pool's known_hosts file (one host key) at ``addresses`` (after a restart)."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().split(None, 1)[1].strip()
    except (OSError, IndexError) as exc:
        raise ProvisionError(f"the pool's host key file {path} is missing or empty ({exc})", provider="aws") from None
    directory, name = os.path.split(path)
    fresh = f"{name}.{os.getpid()}.new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, fresh))
    os.replace(write_private(directory, fresh, "".join(f"{a} {key}\n" for a in dict.fromkeys(addresses))), path)
