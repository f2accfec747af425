"""The torch plugin's worker side: the torchrun-style variables of each worker process, how
nodes that share a host divide its CPUs and GPUs, and the one default process group
(:func:`setup_process_group`, called by ``sky.plugins.torch()``'s ``around_app`` hook and by
``@sky.integrations.torch``). The client side (validation, the image's packages, the factory)
is :mod:`skyward.plugins._torch`.

torch is imported inside the functions only, on the worker.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from skyward._optional import require

if TYPE_CHECKING:
    from skyward.runtime import InstanceInfo

__all__ = ["DEFAULT_TIMEOUT", "Backend", "distributed_env", "host_share", "node_devices", "setup_process_group"]

Backend = Literal["nccl", "gloo"]

#: Seconds a rank waits for the others: at rendezvous, and in every collective afterwards.
#: Long enough for a slow first step (data loading, compilation) on a big model; short enough
#: that a lost peer surfaces within minutes rather than torch's own default of half an hour.
DEFAULT_TIMEOUT = 600.0


def distributed_env(info: InstanceInfo) -> dict[str, str]:
    """The torchrun-style variables for this worker process of the pool.

    As ``torchrun --nnodes N --nproc_per_node K`` sets them: ``RANK`` is the process's global
    rank (``node * K + local_rank``), ``WORLD_SIZE`` is ``N * K``, ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` are per node (``local_rank`` and ``K``), ``GROUP_RANK`` and
    ``NODE_RANK`` the node, ``TORCHELASTIC_RUN_ID`` the pool. Per node also on the Local
    provider, where several nodes share one host.
    """
    return {
        "MASTER_ADDR": info.head_addr,
        "MASTER_PORT": str(info.head_port),
        "WORLD_SIZE": str(info.world_size),
        "RANK": str(info.rank),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.processes_per_node),
        "GROUP_RANK": str(info.node),
        "NODE_RANK": str(info.node),
        "TORCHELASTIC_RUN_ID": info.pool_id or "skyward",
    }


def host_share(info: InstanceInfo) -> tuple[int, int]:
    """(this process's index among the worker processes on its *host*, how many there are).

    Nodes of the Local provider (or several SSH nodes given one address) share a host: its
    CPUs and GPUs are divided among all their processes, node by node."""
    mine = next((p.addr for p in info.peers if p.node == info.node), None)
    nodes_here = sorted(p.node for p in info.peers if p.addr == mine) if mine is not None else [info.node]
    k = info.processes_per_node
    return nodes_here.index(info.node) * k + info.local_rank, len(nodes_here) * k


def node_devices(info: InstanceInfo, host_gpus: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for this process when several nodes share its host (the Local
    provider): each node sees its own ``processes_per_node`` GPUs, so that ``cuda:LOCAL_RANK``
    is this process's device as under torchrun. None when the node has the host to itself or
    the host has too few GPUs to give every process one."""
    slot, on_host = host_share(info)
    k = info.processes_per_node
    if on_host == k or host_gpus < on_host:
        return None
    first = slot - info.local_rank
    return ",".join(str(d) for d in range(first, first + k))


def _host_gpu_count() -> int:
    """GPUs on this host, asked of nvidia-smi (it does not touch CUDA, which must not start
    before CUDA_VISIBLE_DEVICES is set); 0 without it."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# Two tasks running side by side on one worker (concurrency > 1) may both reach
# setup_process_group first; only one may initialise.
_init_lock = threading.Lock()


def setup_process_group(info: InstanceInfo, backend: Backend | None = None,
                        timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Export :func:`distributed_env` and initialise torch's default process group.

    Guarantees:

    1. A pool of one worker process: nothing is set or initialised; returns False.
    2. A process group already exists (the plugin, the decorator, or the user made it):
       nothing is changed; returns False. So calling this more than once is harmless.
    3. Otherwise the variables are exported, this rank is pinned to its own CUDA device when
       CUDA is present (``torch.cuda.set_device(LOCAL_RANK)``), the group is initialised with
       a TCPStore that rank 0 serves on ``MASTER_ADDR`` only (not every interface) and
       ``timeout`` seconds, and True is returned: the caller owns the group and should
       destroy it.

    ``backend=None`` picks "nccl" when CUDA is available and this host has a device for each
    of its ranks, else "gloo". Asking for "nccl" when ranks would have to share a device
    raises RuntimeError (NCCL refuses two ranks on one GPU).
    """
    if info.world_size < 2:
        return False
    torch = require("torch", "the torch process group (sky.plugins.torch, @sky.integrations.torch)")
    import torch.distributed as dist

    with _init_lock:
        if dist.is_initialized():
            return False
        env = distributed_env(info)
        slot, on_host = host_share(info)  # this process among all the processes on its host
        gpu, gpu_users = slot, on_host  # which of the visible GPUs is ours, among how many users
        visible = None if "CUDA_VISIBLE_DEVICES" in os.environ else node_devices(info, _host_gpu_count())
        if visible is not None:  # (set before CUDA starts; the user's own setting wins)
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
            gpu, gpu_users = info.local_rank, info.processes_per_node
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        enough = devices >= gpu_users
        if backend is None:
            backend = "nccl" if devices and enough else "gloo"
        if backend == "nccl" and not enough:
            raise RuntimeError(
                f"backend 'nccl' needs one CUDA device per rank, but {gpu_users} ranks share this host's "
                f"{devices} CUDA device(s); use backend='gloo' or fewer processes per host"
            )
        os.environ.update(env)
        if _is_loopback(info.head_addr):
            # Every rank is on this machine: the collectives' own sockets stay on loopback too
            # (gloo and NCCL otherwise listen on the address the hostname resolves to).
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        _pin_interface(info.head_addr)  # elsewhere: the interface that routes to the head
        _share_cpus(torch, on_host)
        if devices and enough:
            torch.cuda.set_device(gpu)  # cuda:LOCAL_RANK, as under torchrun
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        store = _rendezvous_store(info, rank, world, timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        return True


def _is_loopback(addr: str) -> bool:
    import ipaddress

    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _rendezvous_store(info: InstanceInfo, rank: int, world: int, timeout: timedelta) -> Any:
    """torch's TCPStore for the rendezvous, served by rank 0 on the address its peers use.

    ``init_method="env://"`` would have rank 0 listen on every interface (torch binds the
    wildcard address), so anyone who can reach the machine could talk to the store. Rank 0
    binds the socket itself, to ``head_addr`` (loopback on the Local provider), and hands it
    to the store. Where that address is not one of this machine's (a NAT'd address given to
    sky.SSH), it falls back to every interface and says so on stderr.
    """
    from torch.distributed import TCPStore

    if rank != 0:
        return TCPStore(info.head_addr, info.head_port, world, False, timeout)
    listener = _listen(info.head_addr, info.head_port)
    return TCPStore(info.head_addr, info.head_port, world, True, timeout, master_listen_fd=listener.detach())


def _listen(addr: str, port: int) -> Any:
    import socket
    import sys

    last: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.listen(128)
        return sock
    print(f"skyward: the rendezvous store cannot bind {addr}:{port} ({last}); listening on every interface",
          file=sys.stderr)
    sock = socket.create_server(("", port), reuse_port=False)
    return sock


def _pin_interface(head_addr: str) -> None:
    """Make gloo and NCCL use the network interface that routes to the head.

    Left to themselves they take the interface of the address this host's name resolves to,
    and Debian's ``/etc/hosts`` maps the name to 127.0.1.1: the ranks then advertise a
    loopback address to each other and never meet. The interface that routes to the head
    carries the address the pool reached this node at, whatever ``/etc/hosts`` says. A
    variable the user (or the image) set is kept.
    """
    names = [n for n in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if not os.environ.get(n)]
    if not names:
        return
    interface = interface_to(head_addr)
    if interface is not None:
        os.environ.update(dict.fromkeys(names, interface))


def interface_to(addr: str) -> str | None:
    """The name of this host's IPv4 interface whose address a packet to ``addr`` leaves from;
    None where that cannot be told (IPv6, no such interface, not Linux)."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))  # a datagram socket sends nothing: only the route is looked up
            local = probe.getsockname()[0]
        interfaces = socket.if_nameindex()
    except OSError:
        return None
    for _, name in interfaces:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(query.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == local:
            return name
    return None


def _share_cpus(torch: Any, local_size: int) -> None:
    """Give each of the ``local_size`` ranks on this host its share of the CPUs.

    Every rank would otherwise start one intra-op thread per core; with several ranks on one
    host the OpenMP threads oversubscribe the cores and spin against each other (measured:
    16x slower DDP steps with 2 ranks on 2 cores). torchrun avoids the same trap by setting
    OMP_NUM_THREADS=1. An explicit OMP_NUM_THREADS from the user always wins.
    """
    if local_size < 2 or os.environ.get("OMP_NUM_THREADS"):
        return
    threads = max(1, (os.cpu_count() or 1) // local_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@contextlib.contextmanager
def _process_group(info: InstanceInfo, *, backend: Backend | None, timeout: float) -> Iterator[None]:
    owned = setup_process_group(info, backend, timeout)
    try:
        yield
    finally:
        if owned:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
