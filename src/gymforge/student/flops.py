"""Model FLOPs per trained token and the accelerators' dense bf16 peaks: the two halves of MFU (model FLOPs
utilisation = FLOPs per token x tokens/s / peak FLOP/s), which SFT and RL log and bench/gpu_check.py reports.

FLOPs per token are 6 x the matmul parameters (the layers' projections and MLP, and the LM head) plus causal
attention, 6 x layers x query heads x head_dim x the attended length: half of PaLM's 12 x ... x length, since a
causal kernel computes half the score matrix. Where several conversations share a row (packing) attention stays
within each, so the length is their token-weighted mean (`attention_length`). Gradient checkpointing's recomputed
forward is not counted, as is usual for MFU.

The peaks are the dense (no sparsity) bf16 tensor-core FLOP/s of the cards named in `PEAK_BF16`, matched against the
name torch reports; any other device (a CPU, an unlisted GPU) has no peak, and then there is no MFU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) by the name torch reports
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def flops_per_token(config: Any, length: float) -> float:
    """Model FLOPs per trained token (forward and backward) of a decoder with this `transformers` config, at an
    attended length of `length` tokens (module docstring)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    matmul_params = layers * per_layer + h * config.vocab_size
    return 6 * matmul_params + 6 * layers * q * length


def attention_length(lengths: Sequence[int]) -> float:
    """The length that gives the causal attention FLOPs of these conversations per token: each token attends within
    its own conversation, so the token-weighted mean length (sum of n^2 over sum of n)."""
    return sum(n * n for n in lengths) / sum(lengths)


def peak_bf16_flops(name: str) -> float | None:
    """The dense bf16 peak of the device torch calls `name`, or None where it is not in `PEAK_BF16`."""
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def device_peak_flops(device: Any = None) -> float | None:
    """The dense bf16 peak of one CUDA device (`device`: a torch device or index; the current one by default), or
    None without CUDA, on a non-CUDA device, or on a GPU not in `PEAK_BF16`."""
    import torch

    if not torch.cuda.is_available():
        return None
    if device is not None and not isinstance(device, int) and torch.device(device).type != "cuda":
        return None
    return peak_bf16_flops(torch.cuda.get_device_name(device))
