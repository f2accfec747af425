"""Autocast on ``sky``: ``torch.autocast("sky", dtype=...)`` casts as CUDA's autocast does.

torch registers autocast kernels for its own backends only; for a custom backend every operation
on a ``sky`` tensor would find no kernel under the autocast key at all. So: a fallthrough for
every operation (autocast leaves it alone), and for the operations CUDA runs in lower precision
(matrix products, convolutions, attention) a kernel that casts their floating-point ``sky``
inputs to the autocast dtype, and for those CUDA keeps in float32 (reductions, norms, losses,
softmax) one that casts them to float32. The casts are ordinary operations below autocast, so
autograd records them, as on CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

KEY = "AutocastPrivateUse1"

# Operations CUDA's autocast runs in the autocast dtype (``torch.autocast``'s documentation lists
# them: "CUDA Ops that can autocast to float16").
LOWER = (
    "mm", "bmm", "matmul", "linear", "addmm", "addmv", "addr", "addbmm", "baddbmm", "chain_matmul",
    "linalg_multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "convolution", "_convolution", "prelu", "scaled_dot_product_attention",
    "conv_tbc", "_native_multi_head_attention",
)
# ... and those it runs in float32 ("CUDA Ops that can autocast to float32").
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "prod", "sum",
    "cross_entropy_loss",
)


def _cast(dtype: torch.dtype) -> Any:
    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "sky" and x.is_floating_point() \
                and x.dtype != torch.float64 and x.dtype != dtype:
            return x.to(dtype)
        return x

    return cast


def _kernel(op: Any, to: torch.dtype | None) -> Any:
    """A kernel under the autocast key: cast the inputs, then run ``op`` below autocast."""
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def run(*args: Any, **kwargs: Any) -> Any:
        dtype = to or torch.get_autocast_dtype("sky")
        with torch._C._ExcludeDispatchKeyGuard(below):
            args, kwargs = pytree.tree_map(_cast(dtype), (args, kwargs))
            return op(*args, **kwargs)

    return run


def register(lib: torch.library.Library, every: torch.library.Library) -> None:
    """Register the fallthrough (on ``every``, a ``"_"`` library) and the casting kernels."""
    every.fallback(torch.library.fallthrough_kernel, KEY)
    for names, to in ((LOWER, None), (FLOAT32, torch.float32)):
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(torch.ops.aten, packet, None)
            if op is None:
                continue
            for o in ([overload] if overload else op.overloads()):
                if "out" in o:  # (an out= tensor is the caller's: never replaced by a cast copy)
                    continue
                qualified = f"{packet}.{o}" if o != "default" else packet
                lib.impl(qualified, _kernel(getattr(op, o), to), KEY)
