"""``sky.plugins.torch``: install PyTorch on every node and join the workers in one process group.

Two hooks:

* ``transform`` (client): appends ``torch`` (and optionally ``torchvision``/``torchaudio``)
  to the image's pip packages and the matching ``download.pytorch.org`` wheel index to its
  indexes — CUDA wheels when the pool's accelerator runs CUDA, CPU wheels otherwise. What
  the image and earlier plugins already had is kept, in order.
* ``around_app`` (worker, once per worker process): on a pool of two or more nodes, exports
  the variables ``torchrun`` would (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
  ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``) and
  ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (the interface that routes to the head), calls
  ``torch.distributed.init_process_group`` and, when the worker stops, destroys the group.
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

from skyward.errors import ConfigError
from skyward.plugins._base import Cluster, Plugin

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


# -- validation (shared with skyward.integrations) ------------------------------------------------


def check_backend(backend: object) -> Backend | None:
    """Return ``backend`` if it is None, "nccl" or "gloo"; else raise ConfigError."""
    if backend not in _BACKENDS:
        raise ConfigError("backend", 'None (auto: "nccl" with CUDA, else "gloo"), "nccl" or "gloo"', backend)
    return backend  # type: ignore[return-value]


def check_timeout(timeout: object) -> float:
    """Return ``timeout`` as float seconds if it is a positive number; else raise ConfigError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError("timeout", "a positive number of seconds", timeout)
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


def _transform(image: Image, cluster: Cluster, *, packages: tuple[str, ...], cuda: str) -> Image:
    index = _WHEELS.format(cuda if cluster.cuda else "cpu")
    return image.with_pip(*packages, index=index)


# -- worker side ----------------------------------------------------------------------------------


def distributed_env(info: InstanceInfo) -> dict[str, str]:
    """The torchrun-style variables for this node of the pool.

    ``RANK`` is the node number and ``WORLD_SIZE`` the number of nodes (one process per node).
    Ranks are grouped into hosts by their peer address: ``LOCAL_RANK`` is this rank's position
    among the ranks on its host, ``LOCAL_WORLD_SIZE`` how many ranks that host runs, and
    ``NODE_RANK`` the host's position among the distinct hosts. With one rank per machine
    that is ``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``, ``NODE_RANK=RANK``; with every rank on
    one host (the Local provider) it is ``LOCAL_RANK=RANK``, ``LOCAL_WORLD_SIZE=WORLD_SIZE``,
    ``NODE_RANK=0``.
    """
    peers = sorted(info.peers, key=lambda p: p.node)
    mine = next((p.addr for p in peers if p.node == info.node), None)
    if mine is None:  # no peer list: assume a host of our own
        local_rank, local_size, node_rank = 0, 1, info.node
    else:
        on_host = [p.node for p in peers if p.addr == mine]
        hosts = list(dict.fromkeys(p.addr for p in peers))
        local_rank, local_size, node_rank = on_host.index(info.node), len(on_host), hosts.index(mine)
    return {
        "MASTER_ADDR": info.head_addr,
        "MASTER_PORT": str(info.head_port),
        "WORLD_SIZE": str(info.total_nodes),
        "RANK": str(info.node),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "NODE_RANK": str(node_rank),
    }


# Two tasks running side by side on one worker (concurrency > 1) may both reach
# setup_process_group first; only one may initialise.
_init_lock = threading.Lock()


def setup_process_group(info: InstanceInfo, backend: Backend | None = None,
                        timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Export :func:`distributed_env` and initialise torch's default process group.

    Guarantees:

    1. A pool of one node: nothing is set or initialised; returns False.
    2. A process group already exists (the plugin, the decorator, or the user made it):
       nothing is changed; returns False. So calling this more than once is harmless.
    3. Otherwise the variables are exported, this rank is pinned to its own CUDA device when
       CUDA is present (``torch.cuda.set_device(LOCAL_RANK)``), the group is initialised with
       ``init_method="env://"`` and ``timeout`` seconds, and True is returned: the caller
       owns the group and should destroy it.

    ``backend=None`` picks "nccl" when CUDA is available and this host has a device for each
    of its ranks, else "gloo". Asking for "nccl" when ranks would have to share a device
    raises RuntimeError (NCCL refuses two ranks on one GPU).
    """
    if info.total_nodes < 2:
        return False
    import torch
    import torch.distributed as dist

    with _init_lock:
        if dist.is_initialized():
            return False
        env = distributed_env(info)
        local_rank, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        enough = devices >= local_size
        if backend is None:
            backend = "nccl" if devices and enough else "gloo"
        if backend == "nccl" and not enough:
            raise RuntimeError(
                f"backend 'nccl' needs one CUDA device per rank, but this host runs {local_size} "
                f"ranks and has {devices} CUDA device(s); use backend='gloo' or fewer nodes per host"
            )
        os.environ.update(env)
        _pin_interface(info.head_addr)
        _share_cpus(torch, local_size)
        if devices and enough:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))
        return True


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
    cuda: str = "cu128",
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
