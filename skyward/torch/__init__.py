"""A remote torch device: ``torch.device("sky:N")`` is a device of a pool's node.

::

    from skyward.torch import Compute, compute

    with Compute(provider=sky.Local()) as node:
        device = node.device("cpu")          # "cuda" on a GPU node
        model = Net().to(device)             # the parameters now live on the node
        loss = model(x.to(device)).sum()     # streamed there, not run here
        loss.backward()
        print(loss.item())                   # a sync point: one round trip

Tensors on a ``sky`` device are handles (shape, strides, dtype); the data stays on the node's
worker. Operations are queued and sent in batches; the client waits only where it needs a
value. See the "Remote device" page of the docs for what works and what does not yet.
"""

from __future__ import annotations

from skyward._optional import require

require("torch", "skyward.torch (the remote device)")
require("numpy", "skyward.torch (the remote device)", extra="torch")

from skyward.torch._tensor import SkyTensor  # noqa: E402
from skyward.torch._compute import Cluster, Compute, compute  # noqa: E402

__all__ = ["Cluster", "Compute", "SkyTensor", "compute"]
