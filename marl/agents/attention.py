"""Grouped-query attention without copying the KV heads on CPU.

transformers' ``sdpa`` attention lets PyTorch's SDPA read grouped KV heads directly
(``enable_gqa``) only when no attention mask is passed; with one, it first copies every KV head
``num_heads / num_kv_heads`` times.  The host's batches always carry a mask (right padding, a
shared KV cache), and on CPU that copy and its backward made a learner pass over a KV cache
that every candidate reads 1.84x slower (SmolLM2: 9 query heads on 3 KV heads).  PyTorch's
CPU SDPA accepts a mask together with ``enable_gqa``, so ``sdpa_gqa`` passes it through; any
other case (no mask, other devices, a position bias) is transformers' own ``sdpa``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA over ``query`` [batch, heads, q, dim] and grouped ``key``/``value``
    [batch, kv_heads, k, dim] under ``attention_mask``, the KV heads read in place."""
    if (
        attention_mask is None
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_gqa_sdpa(model: torch.nn.Module) -> None:
    """Switch ``model`` from transformers' ``sdpa`` to :func:`sdpa_gqa_forward`; a model on
    any other attention implementation keeps it."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
