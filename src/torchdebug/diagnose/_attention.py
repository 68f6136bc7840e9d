"""Fused attention kernels in the node-by-node reference, and which ops draw random numbers.

``F.scaled_dot_product_attention`` reaches an AOT graph as one fused kernel op picked by device and
dtype: ``_scaled_dot_product_flash_attention_for_cpu`` on the CPU, the flash, memory-efficient and
cuDNN kernels on CUDA, the overrideable one on other accelerators (each with a ``_backward`` op).
They return several values (the attention output, then bookkeeping: logsumexp, RNG state,
sequence offsets, a debug mask) and are tagged ``nondeterministic_seeded`` because they can apply
dropout. With ``dropout_p == 0`` they are deterministic, and :func:`is_random` says so.

Most of them run only in half precision or float32 (the CPU one also in float64), so the float64
side of the comparison is attention written out, ``softmax(q @ k^T * scale + mask) @ v``, and
autograd of it for the backward ops (:func:`reference`). Only the attention output and the
gradients are compared; the bookkeeping outputs differ in layout between kernels, so the float64
side takes them from the op run in the program's dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torchdebug._torch.dispatch import OpOverload, op_schema

FORWARD = frozenset(
    {
        "_scaled_dot_product_flash_attention_for_cpu",  # CPU
        "_scaled_dot_product_flash_attention",  # CUDA, FlashAttention (fp16/bf16)
        "_scaled_dot_product_efficient_attention",  # CUDA, memory-efficient (fp16/bf16/fp32)
        "_scaled_dot_product_cudnn_attention",  # CUDA, cuDNN (fp16/bf16)
        "_scaled_dot_product_fused_attention_overrideable",  # other accelerators
    }
)
"""The fused SDPA kernel ops, by name; their inputs are laid out ``(batch, heads, sequence, dim)``."""

BACKWARD = frozenset(f"{name}_backward" for name in FORWARD)
"""Their backward ops; they return the gradients of query, key, value (and of the bias, for some)."""

_GRADIENT_OF = ("query", "key", "value", "bias")


def op_name(target: Any) -> str:
    """``_scaled_dot_product_flash_attention_for_cpu`` for ``aten._scaled_dot_product_flash_attention_for_cpu.default``."""
    return target.overloadpacket.__name__ if isinstance(target, OpOverload) else ""


def is_attention(target: Any) -> bool:
    return op_name(target) in FORWARD or op_name(target) in BACKWARD


def bound_arguments(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The value of every argument of ``op``'s schema by name (defaults filled in)."""
    bound: dict[str, Any] = {}
    for index, argument in enumerate(op_schema(op).arguments):
        if index < len(args) and not argument.kwarg_only:
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            bound[argument.name] = None
    return bound


def is_random(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a call draws random numbers: an op tagged ``nondeterministic_seeded`` (or an SDPA
    backward op) unless its dropout probability is 0 (SDPA kernels, RNNs) or it runs outside
    training (``dropout(train=False)``)."""
    if not isinstance(target, OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags and op_name(target) not in BACKWARD:
        return False
    bound = bound_arguments(target, args, kwargs)
    if bound.get("train", True) is False:
        return False
    for name in ("dropout_p", "dropout"):
        if isinstance(bound.get(name), (int, float)):
            return bound[name] != 0
    return True


def _attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float | None
) -> torch.Tensor:
    """Scaled dot-product attention written out, as ``F.scaled_dot_product_attention`` documents it
    (grouped-query attention: key and value heads repeated)."""
    if key.size(-3) != query.size(-3):
        key = key.repeat_interleave(query.size(-3) // key.size(-3), dim=-3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), dim=-3)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1) @ value


def reference(
    target: OpOverload, args: Sequence[Any], kwargs: dict[str, Any], eager: Sequence[Any]
) -> tuple[tuple[Any, ...], set[int]]:
    """The float64 results of an SDPA kernel op called with float64 ``args``, and the indices of its
    results that are compared. ``eager`` is the op's own result in the program's dtypes; the
    bookkeeping results are taken from it."""
    bound = bound_arguments(target, args, kwargs)
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    mask = mask if isinstance(mask, torch.Tensor) else None
    causal, scale = bool(bound.get("is_causal", False)), bound.get("scale")
    results = [_widened(value) for value in eager]
    if op_name(target) in FORWARD:
        results[0] = _like(_attention(bound["query"], bound["key"], bound["value"], mask, causal, scale), eager[0])
        return tuple(results), {0}
    wanted = [bound["query"], bound["key"], bound["value"]]
    grad_mask = bound.get("grad_input_mask")
    if len(results) > 3 and mask is not None and mask.is_floating_point() and (grad_mask is None or grad_mask[3]):
        wanted.append(mask)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in wanted]
        out = _attention(*leaves[:3], leaves[3] if len(leaves) > 3 else mask, causal, scale)
        grads = torch.autograd.grad(out, leaves, bound.get("grad_out", bound.get("grad_out_")))
    for index, grad in enumerate(grads):
        results[index] = _like(grad, eager[index])
    return tuple(results), set(range(len(grads)))


def _like(value: torch.Tensor, kernel: Any) -> torch.Tensor:
    """``value`` laid out with the strides of the kernel's result (the CPU flash kernel returns its
    output as a transposed view, which the graph's next ``view`` relies on)."""
    if not isinstance(kernel, torch.Tensor) or kernel.shape != value.shape or kernel.stride() == value.stride():
        return value
    return torch.empty_strided(kernel.shape, kernel.stride(), dtype=value.dtype, device=value.device).copy_(value)


def _widened(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    return value
