"""Model FLOPs per token and device peaks (gymforge.student.flops): the two halves of the MFU that SFT and RL log."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gymforge.student import flops


def test_flops_per_token_matches_a_hand_count() -> None:
    # hidden 8, 2 layers, 2 query heads and 1 key-value head of 4, MLP 16, vocabulary 10
    config = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=4, intermediate_size=16, vocab_size=10)
    # per layer: q 8x8=64, k and v 8x4 each=64, o 8x8=64, MLP 3x8x16=384 -> 576; 2 layers 1152, LM head 80 -> 1232
    # causal attention at length 100: 6 x 2 layers x 8 (query width) x 100 = 9600
    assert flops.flops_per_token(config, 100) == 6 * 1232 + 9600 == 16992
    # without head_dim and key-value heads (a Llama-style config): head_dim = hidden / heads, every head its own kv
    plain = SimpleNamespace(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                            vocab_size=10)
    assert flops.flops_per_token(plain, 0) == 6 * (64 + 128 + 64 + 384 + 80)


def test_attention_length_and_peaks() -> None:
    assert flops.attention_length([10, 30]) == pytest.approx((100 + 900) / 40)  # token-weighted: 25, not 20
    assert flops.peak_bf16_flops("NVIDIA H200") == 989.4e12
    assert flops.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert flops.peak_bf16_flops("NVIDIA GeForce RTX 4090") is None  # not in the table: no peak, so no MFU
    assert flops.device_peak_flops("cpu") is None
