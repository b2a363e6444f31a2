"""The RL update's samples when a reply and its prompt are longer than `rl.max_length` (`gymforge.rl.grpo.tokenize`):
the prompt loses its start, the sample is marked truncated, and the sampler's log-probs (taken on the whole context)
are neither its behaviour policy nor part of the sampler/trainer mismatch (issue #41: at max_length 2,048 the
offline student's 6-step episodes had 61% of their replies cut and a mismatch of 0.24 that was all truncation)."""

from __future__ import annotations

import random

import pytest

from gymforge.core.tokens import Sampled
from gymforge.rl import grpo

torch = pytest.importorskip("torch")


def _sample(prompt: list[int], reply: list[int], logprobs: list[float]) -> grpo.ActionSample:
    return grpo.ActionSample(request=[], response="", duration_s=0.0, episode=0, advantage=1.0,
                             sampled=Sampled(prompt_ids=prompt, ids=reply, logprobs=logprobs))


def test_a_sample_longer_than_max_length_is_marked_truncated_and_takes_no_importance_weight() -> None:
    whole = grpo.tokenize(_sample([1, 2, 3, 4], [5, 6, 7], [-0.5, -0.6, -0.7]), None, 7, None)
    assert not whole.truncated and whole.sampler_logprobs == [-0.5, -0.6, -0.7]
    cut = grpo.tokenize(_sample([1, 2, 3, 4], [5, 6, 7], [-0.5, -0.6, -0.7]), None, 5, None)
    assert cut.truncated and cut.input_ids == [3, 4, 5, 6, 7] and cut.sampler_logprobs is None
    assert grpo.truncated_count([whole, cut]) == 1
    assert grpo.path_counts([whole, cut]) == {"sampled": 2, "retokenized": 0}  # still its sampled ids


def test_the_mismatch_measures_the_numerics_not_the_cut_context() -> None:
    """The sampler is the trainer (same model, same numerics): no mismatch on whole samples; a cut sample, whose
    trainer log-probs see a shorter context than the sampler did, is left out instead of reported as mismatch."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)).eval()
    prompt, reply = [random.Random(k).randrange(64) for k in range(40)], [7, 8, 9, 10, 11, 12]
    with torch.no_grad():
        sampler = grpo.token_logprobs(model, prompt + reply, 0.7, len(prompt) - 1).tolist()

    def run(max_length: int) -> tuple[list[grpo.ActionSample], dict[str, float]]:
        kept = grpo.prepare([_sample(prompt, reply, sampler)], None, model, model, max_length=max_length,
                            template=None, temperature=0.7, single_step=True)
        stats = grpo.update(model, torch.optim.SGD(model.parameters(), lr=0.0), kept, epochs=1, minibatches=1,
                            clip_eps=0.2, kl_coef=0.0, max_grad_norm=1.0, rng=random.Random(0), temperature=0.7)
        return kept, stats

    kept, stats = run(64)
    assert not kept[0].truncated and stats["mismatch_tokens"] == len(reply)
    assert stats["mismatch_abs_logprob"] < 1e-5
    kept, stats = run(20)  # the first 26 prompt tokens are cut: the trainer's log-probs differ from the sampler's
    with torch.no_grad():
        cut_lp = grpo.token_logprobs(model, kept[0].input_ids, 0.7, kept[0].start)
    assert (cut_lp - torch.tensor(sampler)).abs().mean() > 1e-3  # what the curve reported as mismatch before
    assert kept[0].truncated and stats["mismatch_tokens"] == 0 and stats["mismatch_abs_logprob"] == 0.0
