"""Walk PyTorch's operator database (``op_db``) on a ``sky`` device against the CPU.

For every operation with float32 samples: its first sample(s) run on the CPU and on ``sky``; the
outputs must be equal (``torch.testing.assert_close``'s float32 tolerances) with the CPU's
strides, and where the operation has a gradient, so must the gradients of its inputs. Each
operation gets one verdict per pass: ``ok``, ``error`` (sky raised where the CPU did not) or
``wrong`` (a value or a stride differs). Used by ``tests/test_remote_device_ops.py``; run it as
a script for the figures alone::

    python3 -m tests.sky_op_walk            # prints the percentages and every failure
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

SAMPLES = 1
#: Operations whose outputs are uninitialized memory: their metadata is compared, not their values.
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_permuted", "empty_strided"})


@dataclasses.dataclass
class Verdict:
    name: str
    forward: str = "ok"  # ok | error | wrong (a value) | stride (values equal, strides not)
    backward: str = "ok"  # ok | error | wrong | stride | none (no gradient)
    why: str = ""


def op_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def float32_ops() -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def _samples(op: Any) -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)):
            if i >= SAMPLES:
                return
            yield sample


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        y = x.detach().to(device)
        return y.requires_grad_() if x.requires_grad else y
    return x


def _run(op: Any, sample: Any) -> Any:
    return op(sample.input, *sample.args, **sample.kwargs)


def _leaves(x: Any) -> list[Any]:
    return pytree.tree_leaves(x)


def _grads(outs: Any, inputs: list[torch.Tensor], cotangents: list[torch.Tensor]) -> list[Any]:
    with torch.autograd.set_multithreading_enabled(False):
        return list(torch.autograd.grad(outs, inputs, cotangents, allow_unused=True))


def _same(got: Any, want: Any, what: str, values: bool = True) -> str:
    """'' if ``got`` (sky, or a value) matches ``want`` (CPU), else why not."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{what}: {type(got).__name__}, not a tensor"
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            return f"{what}: {tuple(got.shape)} {got.dtype}, the CPU's {tuple(want.shape)} {want.dtype}"
        here = got.detach().cpu()  # (a sync point: the node's corrections to metadata arrive)
        if want.is_conj() != got.is_conj() or want.is_neg() != got.is_neg():
            return f"{what}: conj/neg bits differ"
        if values:
            try:
                torch.testing.assert_close(here, want.detach(), equal_nan=True, check_stride=False)
            except AssertionError as exc:
                return f"{what}: {str(exc).splitlines()[0]}"
        if want.layout == torch.strided and want.numel() > 1 and got.stride() != want.stride():
            return f"{what}: strides {got.stride()}, the CPU's {want.stride()} (values equal)"
        return ""
    if isinstance(want, (int, float, bool, complex)) and not isinstance(want, bool):
        return "" if got == want or (got != got and want != want) else f"{what}: {got!r}, the CPU's {want!r}"
    return "" if got == want else f"{what}: {got!r}, the CPU's {want!r}"


def check(op: Any, device: torch.device) -> Verdict:
    verdict = Verdict(op_name(op), backward="ok" if op.supports_autograd else "none")
    for sample in _samples(op):
        torch.random.default_generator.manual_seed(0)
        try:
            want = _run(op, sample)
        except Exception:  # (a sample the CPU refuses says nothing of sky)
            continue
        torch.random.default_generator.manual_seed(0)
        torch.sky.manual_seed(0)  # (random operations draw the CPU's numbers on the node too)
        try:
            moved = sample.transform(lambda t: _to(t, device))
            got = _run(op, moved)
            wants, gots = _leaves(want), _leaves(got)
            if len(wants) != len(gots):
                raise AssertionError(f"{len(gots)} outputs, the CPU's {len(wants)}")
            for i, (g, w) in enumerate(zip(gots, wants, strict=True)):
                why = _same(g, w, f"output {i}", values=op.name not in UNINITIALIZED)
                if why:
                    verdict.forward, verdict.why = "stride" if "strides" in why else "wrong", why
                    break
        except Exception as exc:
            verdict.forward, verdict.why = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if verdict.forward != "ok":
            verdict.backward = "none" if verdict.backward == "none" else verdict.forward
            return verdict
        if verdict.backward == "none":
            continue
        inputs = [t for t in _leaves((sample.input, sample.args, sample.kwargs))
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        moved_inputs = [t for t in _leaves((moved.input, moved.args, moved.kwargs))
                        if isinstance(t, torch.Tensor) and t.requires_grad]
        outs = [(w, g) for w, g in zip(_leaves(want), _leaves(got), strict=True)
                if isinstance(w, torch.Tensor) and w.requires_grad and w.is_floating_point()]
        if not inputs or not outs:
            continue
        gen = torch.Generator().manual_seed(1)
        cot = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for w, _ in outs]
        try:
            want_grads = _grads([w for w, _ in outs], inputs, cot)
        except Exception:
            continue
        try:
            got_grads = _grads([g for _, g in outs], moved_inputs, [c.to(g.device) for c, (_, g) in zip(cot, outs, strict=True)])
            for i, (g, w) in enumerate(zip(got_grads, want_grads, strict=True)):
                if w is None:
                    continue
                why = _same(g, w, f"gradient {i}")
                if why:
                    verdict.backward, verdict.why = "stride" if "strides" in why else "wrong", why
                    break
        except Exception as exc:
            verdict.backward, verdict.why = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if verdict.backward != "ok":
            return verdict
    return verdict


def walk(device: torch.device) -> list[Verdict]:
    return [check(op, device) for op in float32_ops()]


def figures(verdicts: list[Verdict]) -> str:
    n = len(verdicts)
    fwd = sum(v.forward == "ok" for v in verdicts)
    with_grad = [v for v in verdicts if v.backward != "none"]
    bwd = sum(v.backward == "ok" for v in with_grad)
    wrong = sum("wrong" in (v.forward, v.backward) for v in verdicts)
    return (f"forward {fwd}/{n} ({100 * fwd / n:.1f}%), backward {bwd}/{len(with_grad)} "
            f"({100 * bwd / max(len(with_grad), 1):.1f}%), wrong values {wrong}")


if __name__ == "__main__":
    import time

    import skyward as sky
    from skyward.torch import Compute

    start = time.monotonic()
    with Compute(provider=sky.Local()) as node:
        found = walk(node.device("cpu"))
    for v in found:
        if v.forward != "ok" or v.backward not in ("ok", "none"):
            print(f"{v.name}: forward {v.forward}, backward {v.backward}: {v.why}")
    print(figures(found), f"in {time.monotonic() - start:.0f} s")
