"""``sky.plugins.torch``: install PyTorch on every node and join the workers in one process group.

Two hooks:

* ``transform`` (client): appends ``torch`` (and optionally ``torchvision``/``torchaudio``;
  ``numpy`` too unless the image already names it, since torch warns without it)
  to the image's pip packages and the matching ``download.pytorch.org`` wheel index to its
  indexes — CUDA wheels when the pool's accelerator runs CUDA, CPU wheels otherwise. What
  the image and earlier plugins already had is kept, in order.
* ``around_app`` (worker, once per worker process): on a pool of two or more nodes, exports
  the variables ``torchrun`` would (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
  ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``) and
  ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (the interface that routes to the head), calls
  ``torch.distributed.init_process_group`` and, when the worker stops, destroys the group.
  The rendezvous store on rank 0 listens only on the address its peers use (``MASTER_ADDR``;
  loopback on the Local provider, where gloo and NCCL are kept on loopback too).
  A single-node pool sets nothing and initialises nothing.

:func:`setup_process_group` is the one place that does the worker-side work; the plugin and
the ``@sky.integrations.torch`` decorator both call it.

torch is imported inside the worker-side functions only: importing this module (which the
client does to build the plugin) never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from skyward._optional import require
from skyward.errors import ConfigError
from skyward.plugins._base import PoolInfo, Plugin

if TYPE_CHECKING:
    from skyward.image import Image
    from skyward.runtime import InstanceInfo

__all__ = ["DEFAULT_TIMEOUT", "distributed_env", "requirement", "setup_process_group", "torch"]

Backend = Literal["nccl", "gloo"]

#: Seconds a rank waits for the others: at rendezvous, and in every collective afterwards.
#: Long enough for a slow first step (data loading, compilation) on a big model; short enough
#: that a lost peer surfaces within minutes rather than torch's own default of half an hour.
DEFAULT_TIMEOUT = 600.0

_BACKENDS = (None, "nccl", "gloo")
_CUDA_RE = re.compile(r"^cu\d{3}$")
# A bare version ("2.3.0", "2.3.0+cu121", "2.*") is pinned with ==; anything that starts with
# a PEP 440 comparison operator is a constraint and is passed through unchanged.
_BARE_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!*\-]*$")
_OPERATORS = ("===", "==", "!=", "~=", ">=", "<=", ">", "<")
_WHEELS = "https://download.pytorch.org/whl/{}"
#: The CUDA wheel flavour installed on CUDA nodes unless told otherwise.
DEFAULT_CUDA = "cu128"


# -- validation (shared with skyward.integrations) ------------------------------------------------


def check_backend(backend: object) -> Backend | None:
    """Return ``backend`` if it is None, "nccl" or "gloo"; else raise ConfigError."""
    if backend not in _BACKENDS:
        raise ConfigError("backend", 'None (auto: "nccl" with CUDA, else "gloo"), "nccl" or "gloo"', backend)
    return backend  # type: ignore[return-value]


def check_timeout(timeout: object) -> float:
    """Return ``timeout`` as float seconds if it is a positive number; else raise ConfigError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ConfigError("timeout", "a positive number of seconds (not inf or nan)", timeout)
    return float(timeout)


def _check_version(parameter: str, value: object, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    accepted = '"latest", a version like "2.3.0", or a constraint like ">=2.3"'
    if optional:
        accepted += " (or None to skip)"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(parameter, accepted, value)
    text = value.strip()
    if text == "latest" or text.startswith(_OPERATORS) or _BARE_VERSION_RE.match(text):
        return text
    raise ConfigError(parameter, accepted, value)


# -- client side ----------------------------------------------------------------------------------


def requirement(package: str, version: str) -> str:
    """The pip requirement for ``package`` at ``version``.

    >>> requirement("torch", "latest"), requirement("torch", "2.3.0"), requirement("torch", ">=2.3")
    ('torch', 'torch==2.3.0', 'torch>=2.3')
    """
    if version == "latest":
        return package
    if version.startswith(_OPERATORS):
        return package + version
    return f"{package}=={version}"


def _names_numpy(requirement: str) -> bool:
    return re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0].lower() == "numpy"


def _transform(image: Image, cluster: PoolInfo, *, packages: tuple[str, ...], cuda: str) -> Image:
    index = _WHEELS.format(cuda if cluster.cuda else "cpu")
    # torch does not depend on numpy but warns on import without it ("Failed to initialize
    # NumPy") and tensor.numpy() fails: every node gets numpy unless the image pins its own.
    if not any(_names_numpy(p) for p in image.pip):
        packages = (*packages, "numpy")
    return image.with_pip(*packages, index=index)


# -- worker side ----------------------------------------------------------------------------------


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


# -- the factory ----------------------------------------------------------------------------------


def torch(
    backend: Backend | None = None,
    cuda: str = DEFAULT_CUDA,
    version: str = "latest",
    vision: str | None = None,
    audio: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> Plugin:
    """PyTorch on every node, and a ready ``torch.distributed`` process group on multi-node pools.

    Args:
        backend: ``"nccl"``, ``"gloo"``, or None to choose per worker (nccl with CUDA).
        cuda: CUDA wheel flavour (``"cu118"``, ``"cu121"``, ``"cu124"``, ``"cu128"``...),
            used when the pool's accelerator runs CUDA; otherwise CPU wheels are installed.
        version: torch version: ``"latest"`` (unpinned), ``"2.3.0"`` (``==``), or a
            constraint such as ``">=2.3"`` (passed through).
        vision: torchvision version, same forms; None does not install it.
        audio: torchaudio version, same forms; None does not install it.
        timeout: seconds each rank waits for the others, at start and in every collective.

    Raises:
        ConfigError: for any invalid argument, when the plugin is made.

    >>> import skyward as sky
    >>> with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()]) as pool:  # doctest: +SKIP
    ...     ranks = rank() @ pool     # a task calling torch.distributed.get_rank() -> [0, 1]
    """
    backend = check_backend(backend)
    if not isinstance(cuda, str) or not _CUDA_RE.match(cuda):
        raise ConfigError("cuda", 'a CUDA wheel suffix like "cu118", "cu121", "cu124" or "cu128"', cuda)
    packages = [requirement("torch", _check_version("version", version, optional=False))]  # type: ignore[arg-type]
    for name, parameter, value in (("torchvision", "vision", vision), ("torchaudio", "audio", audio)):
        checked = _check_version(parameter, value, optional=True)
        if checked is not None:
            packages.append(requirement(name, checked))
    return Plugin(
        "torch",
        transform=functools.partial(_transform, packages=tuple(packages), cuda=cuda),
        around_app=functools.partial(_process_group, backend=backend, timeout=check_timeout(timeout)),
    )
