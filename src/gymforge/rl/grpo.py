"""A compact GRPO trainer for multi-turn agent episodes.

Why not TRL's `GRPOTrainer` (trl 1.16.0, pinned in requirements.lock): it generates the completions itself (its own
vLLM or transformers generation) and scores one prompt -> completion pair per sample. Its two multi-turn
hooks do not fit our episodes: `environment_factory` drives tool calls through the chat template's
tool-calling format (our agent acts through fenced text commands, MLGym's interface, in our sandboxes),
and `rollout_func` must return one prompt/completion token sequence per sample, which loses the
per-action structure that duration-aware weighting needs (one weight per action, from the action's
measured execution time) and bypasses our serving seam and episode runner. So the loss is ours, on top
of the SFT masking code (the chat template's `{% generation %}` markers, or TRL's training template for
a template without them: `gymforge.student.masks.check_chat_template`).

One training sample is one model reply ("action") with the exact request the agent loop sent for it
(`gymforge.agent.trajectory.requests_of`: elided observations and format-error re-asks included).

Its tokens are the sampled ones whenever the trajectory kept them (a checkpoint served here records each reply's prompt
ids, reply ids and log-probs: `gymforge.agent.trajectory.reply_tokens`): the sample is the prompt's ids followed by the
reply's, exactly as the server saw and produced them, and the mask covers the reply's ids, the policy's own tokens. No
text is tokenized again: decoding and re-encoding is not the identity (BPE merges across the reply's boundary, spaces,
a reply cut at `max_tokens`), and an update on re-encoded ids would push up or down sequences the policy never
sampled. Replies recorded without ids (an external endpoint) keep the re-tokenized path (`tokenize_sample`: request and
reply text through the chat template, the SFT assistant mask restricted to the reply); `ActionSample.path` says which.

The sampler's log-probs `logq_t` are the behaviour policy. The sampler (vLLM, or the transformers server's cached
decoding) computes with other numerics than the trainer's full forward pass, so a truncated importance weight corrects
the difference (as in "Your efficient RL framework secretly brings you off-policy RL training", Yao et al. 2025):

    w_t       = min(exp(logp_old_t - logq_t), is_cap)             (detached; 1 for re-tokenized samples)
    ratio_t   = exp(logp_t - logp_old_t)                       on the reply's tokens only
    pg_t      = -w_t * min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A)
    kl_t      = exp(ref_t - logp_t) - (ref_t - logp_t) - 1       (k3 estimator, >= 0) to the SFT reference
    loss_k    = mean_t (pg_t + kl_coef * kl_t)
    loss      = sum_k w_k * loss_k / sum_k w_k

`A` is the episode's group-relative advantage (reward minus the group mean, over the group's standard
deviation; a group whose rewards are all equal teaches nothing and gets 0). `w_k` is 1, or with
`duration_aware` the action's execution time (at least `duration_floor_s`) over the batch mean, capped
at `duration_max_weight`: "RL for MLE agents" multiplies each action's gradient by its duration so quick
trivial actions do not outweigh slow real training runs.

An episode's requests repeat each other: the next request is the previous one, its reply and the new observation.
Where a sample's ids begin with all of the previous sample's ids (`chains`), one forward pass over the longer sample
gives both replies' log-probs, exactly as two passes would (attention is causal), so the update runs one pass per chain
and takes each sample's loss on its own reply's positions. A chain breaks where the loop's request differs: after a
format-error re-ask (the accepted reply's request leaves the rejected one out), an elided observation, or a reply whose
re-rendered text is not its sampled ids. In the offline student's 6-step episodes about half the samples chain and the
update reads 1.9x fewer tokens.

The log-probs are taken on the reply's positions only (`reply_logprobs`: the mask is zero before them, so the loss is
the same), and a policy with fp32 weights on a GPU computes under bf16 autocast (`bf16_compute`): fp32 master weights
and optimizer, bf16 matmuls and flash attention.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from gymforge.agent.trajectory import KEEP_OBSERVATIONS, is_model_turn, reply_tokens, requests_of
from gymforge.core.tokens import Sampled
from gymforge.student.masks import check_chat_template, tokenize_with_assistant_mask


# ---- advantages and weights -------------------------------------------------------------------------


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO: (r - mean) / std within one group; all zeros when the group's rewards are equal."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std < eps:
        return [0.0] * len(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def duration_weights(durations: Sequence[float], *, enabled: bool, floor_s: float = 1.0,
                     max_weight: float = 5.0) -> list[float]:
    """Per-action loss weights: 1 each, or the duration normalised to mean 1 over the batch (then capped)."""
    if not durations:
        return []
    if not enabled:
        return [1.0] * len(durations)
    floored = [max(float(d), floor_s, 1e-9) for d in durations]
    mean = sum(floored) / len(floored)
    return [min(d / mean, max_weight) for d in floored]


# ---- samples ----------------------------------------------------------------------------------------


@dataclass
class ActionSample:
    """One model reply with the request it answered."""

    request: list[dict[str, str]]
    response: str
    duration_s: float
    episode: int  # index of its episode in the batch
    advantage: float = 0.0
    weight: float = 1.0
    input_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 on the reply's tokens
    start: int = 0  # `reply_start(mask)`: the log-probs are taken from there on
    old_logprobs: Any = None
    ref_logprobs: Any = None
    sampled: Sampled | None = None  # the reply's tokens as sampled, when the trajectory kept them
    path: str = ""  # `sampled` (the sampled ids) or `retokenized` (request and reply text tokenized again)
    sampler_logprobs: list[float] | None = None  # the sampler's, aligned with ids[start + 1:] (sampled path only)
    truncated: bool = False  # longer than max_length: the prompt lost its start (a context the policy never saw)


def action_samples(traj: Any, episode: int) -> list[ActionSample]:
    """Every reply of a trajectory (rejected malformed ones included) with its request, execution time and, when the
    trajectory kept them, its sampled tokens."""
    requests = requests_of(traj, KEEP_OBSERVATIONS)
    tokens = reply_tokens(traj)
    replies: list[tuple[str, float]] = []
    for step in traj.trajectory:
        model_turn = is_model_turn(step)
        replies.extend((r["response"], 0.0) for r in step.format_errors)  # ran nothing
        if model_turn:
            replies.append((step.response, float(step.execution_time)))
    if len(requests) != len(replies):  # the two walks disagree: never train on misaligned pairs
        raise ValueError(f"episode {episode}: {len(requests)} requests but {len(replies)} replies")
    if len(tokens) != len(replies):
        raise ValueError(f"episode {episode}: {len(tokens)} token records but {len(replies)} replies")
    return [ActionSample(request=req, response=resp, duration_s=dur, episode=episode, sampled=tok)
            for req, (resp, dur), tok in zip(requests, replies, tokens, strict=True)]


def training_template(tokenizer: Any, student: str) -> str | None:
    """How the assistant mask is found: None, the tokenizer's own template (it has `{% generation %}` markers), or
    `"rendered"`, masks from the rendered conversation (`gymforge.student.masks`, templates without markers).
    `tokenize_sample` also takes a template string with markers."""
    if check_chat_template(tokenizer, student) == "tokenizer":
        return None
    return "rendered"


def cut(ids: list[int], mask: list[int], max_length: int | None) -> tuple[list[int], list[int]]:
    """A sample over `max_length` tokens loses the start of its prompt (then of its reply); None keeps it whole."""
    if max_length is None or len(ids) <= max_length:
        return ids, mask
    return ids[-max_length:], mask[-max_length:]


def tokenize_sample(tokenizer: Any, request: list[dict[str, str]], response: str, max_length: int | None,
                    template: str | None = None) -> tuple[list[int], list[int]]:
    """(input ids, mask) of request + reply: the mask covers the reply's tokens only (the SFT assistant mask,
    restricted to the last assistant turn). Over-long samples lose the start of the prompt (`cut`)."""
    messages = [*request, {"role": "assistant", "content": response}]
    if template == "rendered":
        full = tokenize_with_assistant_mask(tokenizer, messages)
        prompt_text = tokenizer.apply_chat_template(request, tokenize=False, add_generation_prompt=True)
        start = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    else:
        kwargs: dict[str, Any] = {"chat_template": template} if template else {}
        full = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True, add_generation_prompt=False, **kwargs)
        prompt = tokenizer.apply_chat_template(request, tokenize=True, return_dict=True, add_generation_prompt=True,
                                               **kwargs)
        start = len(prompt["input_ids"])
    ids, assistant = list(full["input_ids"]), list(full["assistant_masks"])
    return cut(ids, [a if i >= start else 0 for i, a in enumerate(assistant)], max_length)


def sampled_sample(sampled: Sampled, max_length: int) -> tuple[list[int], list[int], list[float]]:
    """(input ids, mask, sampler log-probs) of a reply with its sampled tokens: the prompt's ids then the reply's, the
    mask on the reply's; over-long samples lose the start of the prompt (then of the reply). The log-probs are the
    sampler's for ids[reply_start(mask) + 1:], the positions the loss reads."""
    ids, mask = cut([*sampled.prompt_ids, *sampled.ids], [0] * len(sampled.prompt_ids) + [1] * len(sampled.ids),
                    max_length)
    if sum(mask[1:]) == 0:
        return ids, mask, []
    scored = len(ids) - reply_start(mask) - 1  # every position after the start is a reply token
    return ids, mask, list(sampled.logprobs[len(sampled.logprobs) - scored:])


def tokenize(sample: ActionSample, tokenizer: Any, max_length: int, template: str | None) -> ActionSample:
    """Set a sample's ids, mask and path: its sampled tokens when it has them, else request and reply text tokenized
    again (`tokenize_sample`). A sample longer than `max_length` loses the start of its prompt and is `truncated`:
    the update then trains its reply on a context the policy never saw when it sampled it, and the sampler's
    log-probs (taken on the whole context) are no behaviour policy for it, so it takes no importance weight and no
    part in the mismatch (measured with the offline student's 6-step episodes at max_length 2,048: 61% of the
    replies cut, a mean |trainer - sampler| log-prob of 0.24 that was all truncation, 0.0000 at 4,096)."""
    if sample.sampled is not None:
        sample.input_ids, sample.mask, sample.sampler_logprobs = sampled_sample(sample.sampled, max_length)
        sample.path = "sampled"
        sample.truncated = len(sample.sampled.prompt_ids) + len(sample.sampled.ids) > max_length
        if sample.truncated:  # the sampler's log-probs are of the whole context: no importance weight, no mismatch
            sample.sampler_logprobs = None
    else:
        ids, mask = tokenize_sample(tokenizer, sample.request, sample.response, None, template)
        sample.truncated = len(ids) > max_length
        sample.input_ids, sample.mask = cut(ids, mask, max_length)
        sample.sampler_logprobs, sample.path = None, "retokenized"
    return sample


# ---- log-probs and the loss -------------------------------------------------------------------------


def reply_start(mask: Sequence[int]) -> int:
    """Index (in the ids[1:]-aligned vectors) of the first reply token: the log-probs before it are never needed."""
    return next(j for j, m in enumerate(mask[1:]) if m)


def bf16_compute(model: Any) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for a model with fp32 weights on a CUDA GPU that has bf16 (the policy: fp32 master weights and
    optimizer), else nothing (the CPU computes in fp32, as before). In fp32 SDPA cannot take its flash kernel (16-bit
    inputs only), and the kernel it ran kept every head's full score matrix: 16 x T^2 x 4 bytes a layer, 112 GiB for
    a 0.6B Qwen3 at 8,192 tokens (measured: out of memory on a 141 GB H200). Under bf16 autocast it runs flash."""
    import torch

    param = next(model.parameters(), None)
    if (param is not None and param.device.type == "cuda" and param.dtype == torch.float32
            and torch.cuda.is_bf16_supported()):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def reply_logprobs(model: Any, input_ids: Any, start: int, temperature: float) -> Any:
    """Log-probs of tokens `start+1..` of `input_ids` (a 1-D tensor on the model's device) given their prefix, under
    the policy as it was sampled (logits divided by the sampling temperature), computing the logits of those
    positions only: at 8k tokens x 152k vocabulary the prompt's logits alone would take ~20 GB with their
    gradients, and the mask never reaches them."""
    import torch

    ids = input_ids[None]
    with bf16_compute(model):
        logits = model(input_ids=ids, logits_to_keep=ids.shape[1] - start, use_cache=False).logits[0, :-1]
    logits = logits.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, start + 1:, None])[:, 0]


def token_logprobs(model: Any, input_ids: list[int], temperature: float = 1.0, start: int = 0) -> Any:
    """`reply_logprobs` of a list of ids: from `start`, aligned with ids[start + 1:] (every token's: start 0)."""
    import torch

    return reply_logprobs(model, torch.tensor(input_ids, device=model.device), start, temperature)


def importance_weights(old_lp: Any, sampler_lp: Any, cap: float) -> Any:
    """The truncated importance weight of each token, min(p_trainer / q_sampler, cap), detached: exactly 1 where the
    trainer's log-prob equals the sampler's."""
    import torch

    return torch.clamp(torch.exp(old_lp.detach() - sampler_lp), max=cap)


def mismatch(old_lp: Any, sampler_lp: Any, mask: Any, threshold: float) -> tuple[float, float, float]:
    """(sum of |trainer - sampler| log-prob, tokens over `threshold`, tokens) over a sample's masked tokens."""
    m = mask.to(old_lp.dtype)
    diff = (old_lp.detach() - sampler_lp).abs() * m
    return float(diff.sum()), float(((diff > threshold).to(m.dtype) * m).sum()), float(m.sum())


def sample_loss(new_lp: Any, old_lp: Any, ref_lp: Any, mask: Any, advantage: float, *, clip_eps: float,
                kl_coef: float, sampler_lp: Any = None, is_cap: float = 2.0) -> tuple[Any, Any, Any]:
    """(loss, mean KL, clipped share) of one sample over its masked tokens (tensors aligned with ids[1:]); with the
    sampler's log-probs, each token's policy-gradient term carries its truncated importance weight."""
    import torch

    m = mask.to(new_lp.dtype)
    n = m.sum().clamp(min=1.0)
    ratio = torch.exp(new_lp - old_lp)
    pg = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)
    if sampler_lp is not None:
        pg = pg * importance_weights(old_lp, sampler_lp, is_cap)
    diff = ref_lp - new_lp
    kl = torch.exp(diff) - diff - 1
    loss = ((pg + kl_coef * kl) * m).sum() / n
    clipped = (((ratio - 1).abs() > clip_eps).to(m.dtype) * m).sum() / n
    return loss, (kl * m).sum().detach() / n, clipped.detach()


def chains(samples: Sequence[Any], budget: int | None = None) -> list[list[Any]]:
    """The samples (tokenized, in episode order) in runs whose ids each begin with all of the previous one's ids, within
    one episode: the last sample's forward pass holds every earlier one's log-probs (causal attention). `budget`: at
    most this many log-prob positions (reply tokens) per run, where the head's logits must fit a memory estimate made
    for one reply (`rl.max_new_tokens` + 1 on a GPU, `gymforge.rl.memory`); a sample alone may exceed it."""
    runs: list[list[Any]] = []
    for s in samples:
        last = runs[-1][-1] if runs else None
        if (last is not None and last.episode == s.episode and len(s.input_ids) > len(last.input_ids)
                and s.input_ids[:len(last.input_ids)] == last.input_ids
                and (budget is None or sum(map(reply_positions, runs[-1])) + reply_positions(s) <= budget)):
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def reply_positions(sample: Any) -> int:
    """How many log-probs a sample's loss reads: its ids after `start`."""
    return len(sample.input_ids) - 1 - sample.start


def span_logprobs(model: Any, input_ids: Any, spans: Sequence[tuple[int, int]], temperature: float) -> list[Any]:
    """`reply_logprobs` of several spans of one sequence (a 1-D tensor) in one forward pass: for each (a, b), the
    log-probs of tokens a+1..b given their prefix, computing the logits of those positions only (the observations
    between a chain's replies are read, never scored)."""
    import torch

    if len(spans) == 1:
        return [reply_logprobs(model, input_ids, spans[0][0], temperature)]
    keep = torch.cat([torch.arange(a, b, device=input_ids.device) for a, b in spans])
    with bf16_compute(model):
        logits = model(input_ids=input_ids[None], logits_to_keep=keep, use_cache=False).logits[0]
    lp = torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, input_ids[keep + 1, None])[:, 0]
    return list(torch.split(lp, [b - a for a, b in spans]))


def chain_logprobs(model: Any, chain: Sequence[ActionSample], temperature: float) -> list[Any]:
    """Each sample's `token_logprobs` (aligned with its ids[start + 1:]) from one forward pass over the chain's last
    sample."""
    import torch

    ids = torch.tensor(chain[-1].input_ids, device=model.device)
    return span_logprobs(model, ids, [(s.start, len(s.input_ids) - 1) for s in chain], temperature)


def prepare(samples: list[ActionSample], tokenizer: Any, policy: Any, reference: Any, *, max_length: int,
            template: str | None, temperature: float = 1.0, single_step: bool = False,
            chain_budget: int | None = None) -> list[ActionSample]:
    """Tokenize, then take the sampling policy's and the reference's log-probs (one pass per `chains` run); samples
    without a reply token (cut off by max_length) are dropped. `single_step` (one epoch, one minibatch): the policy
    has not moved when the loss is taken, so the sampling log-probs are the update's own forward pass, detached (no
    extra pass)."""
    import torch

    kept = []
    for s in samples:
        tokenize(s, tokenizer, max_length, template)
        if sum(s.mask[1:]) == 0:
            continue
        s.start = reply_start(s.mask)
        kept.append(s)
    with torch.no_grad():
        for chain in chains(kept, chain_budget):
            olds = [None] * len(chain) if single_step else chain_logprobs(policy, chain, temperature)
            refs = chain_logprobs(reference, chain, temperature)
            for s, old, ref in zip(chain, olds, refs, strict=True):
                s.old_logprobs, s.ref_logprobs = old, ref
    return kept


def path_counts(samples: Sequence[ActionSample]) -> dict[str, int]:
    """How many samples took each token path (`sampled` ids, `retokenized` text)."""
    return {p: sum(1 for s in samples if s.path == p) for p in ("sampled", "retokenized")}


def truncated_count(samples: Sequence[ActionSample]) -> int:
    """How many samples were longer than `max_length` and lost the start of their prompt (`tokenize`)."""
    return sum(1 for s in samples if s.truncated)


def mismatch_stats(abs_sum: float, over: float, tokens: float) -> dict[str, float]:
    """The curve's sampler/trainer mismatch from the totals of `mismatch` (first epoch, before any step)."""
    return {"mismatch_abs_logprob": abs_sum / tokens if tokens else 0.0,
            "mismatch_share_over": over / tokens if tokens else 0.0, "mismatch_tokens": int(tokens)}


def update(policy: Any, optimizer: Any, samples: list[ActionSample], *, epochs: int, minibatches: int,
           clip_eps: float, kl_coef: float, max_grad_norm: float, rng: random.Random,
           temperature: float = 1.0, is_cap: float = 2.0, mismatch_threshold: float = 0.1,
           chain_budget: int | None = None) -> dict[str, float]:
    """Clipped policy-gradient steps over prepared samples, one forward and backward pass per `chains` run (minibatches
    are drawn from the runs); returns mean loss, KL and clipped share over the samples, the tokens the forward and
    backward passes took (`update_tokens`: each run's last sample's length, once per epoch), and the sampler/trainer
    mismatch of the sampled-path samples (`mismatch_stats`, taken before the first step)."""
    import torch

    totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0}
    count = 0
    gap = [0.0, 0.0, 0.0]  # |delta log-prob| sum, tokens over the threshold, tokens
    if not samples:
        return {**totals, "samples": 0, "optimizer_steps": 0, "update_tokens": 0, **mismatch_stats(*gap)}
    seen: set[int] = set()
    steps = tokens = 0
    policy.train()
    runs = chains(samples, chain_budget)
    for _ in range(epochs):
        order = list(range(len(runs)))
        rng.shuffle(order)
        size = math.ceil(len(order) / minibatches)
        for start in range(0, len(order), size):
            batch = [runs[i] for i in order[start:start + size]]
            weight_sum = sum(s.weight for chain in batch for s in chain) or 1.0
            optimizer.zero_grad(set_to_none=True)
            for chain in batch:
                losses = []
                tokens += len(chain[-1].input_ids)
                for s, new_lp in zip(chain, chain_logprobs(policy, chain, temperature), strict=True):
                    mask = torch.tensor(s.mask[1:][s.start:], device=new_lp.device)
                    old_lp = new_lp.detach() if s.old_logprobs is None else s.old_logprobs
                    sampler = None
                    if s.sampler_logprobs is not None:
                        sampler = torch.tensor(s.sampler_logprobs, dtype=old_lp.dtype, device=old_lp.device)
                        if id(s) not in seen:  # the policy as it sampled: the first time the sample is seen
                            seen.add(id(s))
                            taken = mismatch(old_lp, sampler, mask, mismatch_threshold)
                            gap = [a + b for a, b in zip(gap, taken, strict=True)]
                    loss, kl, clipped = sample_loss(new_lp, old_lp, s.ref_logprobs, mask, s.advantage,
                                                    clip_eps=clip_eps, kl_coef=kl_coef, sampler_lp=sampler,
                                                    is_cap=is_cap)
                    losses.append(loss * s.weight / weight_sum)
                    totals["loss"] += float(loss.detach())
                    totals["kl"] += float(kl)
                    totals["clipped"] += float(clipped)
                    count += 1
                torch.stack(losses).sum().backward()  # one backward pass through the chain's forward pass
            torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            optimizer.step()
            steps += 1
    policy.eval()
    return ({k: v / count for k, v in totals.items()}
            | {"samples": len(samples), "optimizer_steps": steps, "update_tokens": tokens} | mismatch_stats(*gap))
