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


def _episode_chain(episode: int, model: object) -> list[grpo.ActionSample]:
    """Three replies of one episode, each next request the previous request and reply plus an observation (a chain),
    then a format re-ask's reply whose request leaves the second reply out (no longer a prefix)."""
    rng = random.Random(1)
    prompt = [rng.randrange(64) for _ in range(30)]
    replies = [[rng.randrange(64) for _ in range(5 + k)] for k in range(4)]
    samples, context = [], prompt
    for k, reply in enumerate(replies):
        if k == 3:
            context = prompt + [1, 2, 3]  # the re-ask's request: not an extension of the chain
        with torch.no_grad():
            lp = grpo.token_logprobs(model, context + reply, 0.7, len(context) - 1).tolist()
        samples.append(grpo.ActionSample(request=[], response="", duration_s=1.0 + k, episode=episode,
                                         advantage=(-1.0) ** k, weight=0.5 + k,
                                         sampled=Sampled(prompt_ids=context, ids=reply, logprobs=lp)))
        context = context + reply + [rng.randrange(64) for _ in range(4)]
    return samples


@pytest.mark.parametrize("single_step", [True, False])
def test_a_chain_of_an_episodes_replies_trains_in_one_pass_as_in_one_pass_each(single_step: bool) -> None:
    """An episode whose requests extend each other trains in one forward and backward pass per chain: the same
    log-probs, loss, statistics and gradient step as one pass per reply, on fewer tokens."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    base = Qwen3ForCausalLM(config).eval()

    def train(chained: bool) -> tuple[list[grpo.ActionSample], dict[str, float], list[object]]:
        model = Qwen3ForCausalLM(config)
        model.load_state_dict(base.state_dict())
        model.eval()
        samples = _episode_chain(0, base)
        if not chained:  # each reply in its own episode: no chain, one pass per reply (the update before chains)
            for k, s in enumerate(samples):
                s.episode = k
        kept = grpo.prepare(samples, None, model, base, max_length=256, template=None, temperature=0.7,
                            single_step=single_step)
        stats = grpo.update(model, torch.optim.SGD(model.parameters(), lr=0.5), kept, epochs=1 if single_step else 2,
                            minibatches=1, clip_eps=0.2, kl_coef=0.1, max_grad_norm=100.0, rng=random.Random(0),
                            temperature=0.7)
        return kept, stats, [p.detach().clone() for p in model.parameters()]

    prepared = grpo.prepare(_episode_chain(0, base), None, base, base, max_length=256, template=None, temperature=0.7)
    assert [len(c) for c in grpo.chains(prepared)] == [3, 1]
    # a budget of log-prob positions (a GPU's memory estimate allows one reply's logits) cuts a run short
    two = grpo.reply_positions(prepared[0]) + grpo.reply_positions(prepared[1])
    assert [len(c) for c in grpo.chains(prepared, budget=two)] == [2, 1, 1]
    assert [len(c) for c in grpo.chains(prepared, budget=1)] == [1, 1, 1, 1]  # a sample alone may exceed it
    kept_c, stats_c, params_c = train(chained=True)
    kept_s, stats_s, params_s = train(chained=False)
    for a, b in zip(kept_c, kept_s, strict=True):
        assert torch.allclose(a.ref_logprobs, b.ref_logprobs, atol=1e-5)
    for key in ("loss", "kl", "clipped", "mismatch_abs_logprob"):
        assert stats_c[key] == pytest.approx(stats_s[key], abs=1e-5), key
    assert stats_c["mismatch_abs_logprob"] < 1e-5  # the sampler was this model: the weights are exactly 1
    moved = max(float((p - q).abs().max()) for p, q in zip(params_s, base.state_dict().values(), strict=True))
    assert moved > 1e-3  # the step did something to compare
    assert max(float((p - q).abs().max()) for p, q in zip(params_c, params_s, strict=True)) < 1e-5
    lengths = [len(s.input_ids) for s in kept_s]
    epochs = 1 if single_step else 2
    assert stats_s["update_tokens"] == sum(lengths) * epochs
    assert stats_c["update_tokens"] == (lengths[2] + lengths[3]) * epochs  # the chain's last sample, the re-ask


def test_minibatches_split_an_iterations_runs_not_its_replies() -> None:
    """`rl.minibatches` deals runs (an episode's replies that extend one another, trained in one pass) into
    minibatches of ceil(runs / minibatches): an episode's chain of three replies stays in one optimizer step."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)).eval()

    def steps(samples: list[grpo.ActionSample], minibatches: int) -> int:
        kept = grpo.prepare(samples, None, model, model, max_length=256, template=None, temperature=0.7)
        stats = grpo.update(model, torch.optim.SGD(model.parameters(), lr=0.0), kept, epochs=1,
                            minibatches=minibatches, clip_eps=0.2, kl_coef=0.0, max_grad_norm=1.0,
                            rng=random.Random(0), temperature=0.7)
        assert stats["samples"] == 4
        return int(stats["optimizer_steps"])

    assert steps(_episode_chain(0, model), 4) == 2  # two runs (the chain of three, the re-ask): two steps, not four
    unchained = _episode_chain(0, model)
    for k, s in enumerate(unchained):  # each reply an episode of its own: four runs of one reply
        s.episode = k
    assert steps(unchained, 4) == 4 and steps(unchained, 3) == 2  # ceil(4 / 3) = 2 runs a step
