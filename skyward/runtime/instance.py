"""Where am I: :class:`InstanceInfo` and :func:`instance_info` (re-exported by :mod:`skyward.runtime`).

A module of its own so that :mod:`skyward.runtime.sharding` can ask which node it runs on without
importing :mod:`skyward.runtime`, which imports it. Imported on workers: nothing heavy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from skyward.runtime import preemption as _preempt
from skyward.errors import ConfigError

__all__ = ["ENV_VAR", "InstanceInfo", "Peer", "instance_info", "node_environment"]

#: The environment variable through which a pool tells each worker who it is (JSON).
ENV_VAR = "COMPUTE_POOL"


@dataclass(frozen=True, slots=True)
class Peer:
    """One node of the pool as seen from the others.

    Attributes:
        node: the node's number (0 is the head).
        addr: the address the other nodes reach it at (a private address in the cloud).
    """

    node: int
    addr: str


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """This node's place in the pool.

    A *node* is a machine; each node runs ``processes_per_node`` worker processes, and this
    one is number ``local_rank`` on its node. ``rank`` (``node * processes_per_node +
    local_rank``) numbers the processes of the whole pool, ``world_size`` counts them.
    ``head_addr``/``head_port`` is where node 0 can be reached by the other nodes (the
    rendezvous point frameworks such as torch.distributed use); ``peers`` lists every node
    with the address the others reach it on; ``accelerators`` is the number of accelerators
    (GPUs) on this node.
    """

    node: int = 0
    total_nodes: int = 1
    head_addr: str = "127.0.0.1"
    head_port: int = 29500
    accelerators: int = 0
    peers: tuple[Peer, ...] = field(default_factory=lambda: (Peer(0, "127.0.0.1"),))
    pool_id: str = ""
    local_rank: int = 0
    processes_per_node: int = 1

    @property
    def is_head(self) -> bool:
        """True on node 0 (whichever of its processes), the node that does the singular work
        (checkpoints, logging)."""
        return self.node == 0

    @property
    def preempting(self) -> _preempt.Preemption | None:
        """The preemption notice this process has received (:class:`~skyward.Preemption`:
        the interruption notice when there is one, else a rebalance recommendation), or None.

        Read anew on every access: a training loop can test ``if info.preempting:`` between
        steps. Notices reach tasks on nodes rented as spot instances (AWS); elsewhere, and
        outside a pool, this stays None.
        """
        return _preempt.current()

    @property
    def rank(self) -> int:
        """This process's number in the pool, ``0 … world_size - 1``, node by node."""
        return self.node * self.processes_per_node + self.local_rank

    @property
    def world_size(self) -> int:
        """How many worker processes the pool has (``total_nodes * processes_per_node``)."""
        return self.total_nodes * self.processes_per_node

    def to_json(self) -> str:
        """This value as JSON (as ``SKYWARD_INSTANCE_INFO`` carries it to child processes)."""
        return json.dumps(
            {
                "node": self.node,
                "total_nodes": self.total_nodes,
                "head_addr": self.head_addr,
                "head_port": self.head_port,
                "accelerators": self.accelerators,
                "peers": [{"node": p.node, "addr": p.addr} for p in self.peers],
                "pool_id": self.pool_id,
                "local_rank": self.local_rank,
                "processes_per_node": self.processes_per_node,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> InstanceInfo:
        data = json.loads(text)
        return cls(
            node=int(data["node"]),
            total_nodes=int(data["total_nodes"]),
            head_addr=str(data["head_addr"]),
            head_port=int(data["head_port"]),
            accelerators=int(data.get("accelerators", 0)),
            peers=tuple(Peer(int(p["node"]), str(p["addr"])) for p in data.get("peers", ())),
            pool_id=str(data.get("pool_id", "")),
            local_rank=int(data.get("local_rank", 0)),
            processes_per_node=int(data.get("processes_per_node", 1)),
        )


_cached: tuple[str | None, InstanceInfo] | None = None


def instance_info() -> InstanceInfo:
    """Return this node's :class:`InstanceInfo`.

    Read from the ``COMPUTE_POOL`` environment variable that the pool sets on every worker;
    outside a pool it describes a single node (node 0 of 1, the head).

    >>> info = instance_info()
    >>> info.node, info.total_nodes, info.is_head
    (0, 1, True)
    """
    global _cached
    raw = os.environ.get(ENV_VAR)
    cached = _cached
    if cached is not None and cached[0] == raw:
        return cached[1]
    if raw:
        try:
            info = InstanceInfo.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(ENV_VAR, "the JSON a ComputePool sets for its workers", raw) from exc
    else:
        info = InstanceInfo()
    _cached = (raw, info)
    return info


def node_environment(info: InstanceInfo, task_id: str, *, cluster: str = "", provider: object = None,
                     user: str | None = None) -> dict[str, str]:
    """The variables every node's worker exports (and so every task and shell command sees);
    built on the client (``user``, default the client's login name, is who launched the pool).

    ``SKYWARD_NODE_IPS`` lists each node's address as the others reach it, one per line, head
    first; ``SKYWARD_NUM_GPUS_PER_NODE`` is the node's accelerator count, or on a node without
    accelerators the number of worker processes per node (so ``torchrun
    --nproc_per_node=$SKYWARD_NUM_GPUS_PER_NODE`` starts one process per slot on a laptop);
    ``SKYWARD_TASK_ID`` is the same on every node and unique per pool. The ``SETUP_*`` names
    hold the same node values for every node of the cluster (a task file's run on fewer nodes
    narrows ``NODE_IPS`` and ``NUM_NODES``, not these); ``CLUSTER_INFO`` is JSON naming the
    cluster (``cluster``), its cloud (``provider``'s name) and region, and its number of nodes.
    Each ``SKYPILOT_*`` name is an alias, so run scripts written for SkyPilot work unchanged.
    """
    import getpass

    ips = "\n".join(p.addr for p in sorted(info.peers, key=lambda p: p.node))
    gpus = info.accelerators if info.accelerators > 0 else info.processes_per_node
    name = getattr(provider, "name", "") or ""
    region = getattr(provider, "region", None) or getattr(getattr(provider, "_client", None), "region", None)
    where = {"cluster_name": cluster, "cloud": _CLOUDS.get(name, name), "region": region or None,
             "zone": None, "num_nodes": info.total_nodes}
    env = {
        "NODE_IPS": ips,
        "NODE_RANK": str(info.node),
        "NUM_NODES": str(info.total_nodes),
        "NUM_GPUS_PER_NODE": str(gpus),
        "TASK_ID": task_id,
        "SETUP_NODE_IPS": ips,
        "SETUP_NODE_RANK": str(info.node),
        "SETUP_NUM_GPUS_PER_NODE": str(gpus),
        "CLUSTER_INFO": json.dumps(where),
        "USER": user if user is not None else getpass.getuser(),
    }
    out = {f"SKYWARD_{k}": v for k, v in env.items()}
    out["SKYWARD_HEAD_IP"] = info.head_addr
    out.update({f"SKYPILOT_{k}": v for k, v in env.items()})
    return out


#: How SKYPILOT_CLUSTER_INFO spells a provider's cloud (SkyPilot's capitals).
_CLOUDS = {"aws": "AWS", "local": "Local", "ssh": "SSH", "slurm": "Slurm"}
