"""Training the student on CPU at the speed the machine allows: the LM head on the trained tokens only, OpenMP
threads that do not spin, and torch's thread count from the job's cores.

Measured with `bench/student_throughput.py` (the offline student: a 4-layer tiny Qwen3, batch size 1, examples of
2k-7.3k tokens; the 2-core machine, idle): 1.46x the tokens/s of before (2.8k -> 4.0k), the same loss curve and
weights up to rounding. A step is attention-bound: ~70-78% of the FLOPs it needs are causal attention (quadratic
in the length), whose CPU kernel (SDPA's flash attention, `head_dim` 32: an exp, a max and a sum per score for 128
FLOPs of matmul) runs at about half the rate of an fp32 matmul; the rest is the linear layers. If every FLOP ran at
the rate its kernel reaches alone on these shapes, the step would run at ~4.9k tokens/s; training reaches ~83% of
that (the rest: RMSNorm, RoPE, SiLU, residual adds, the optimizer, the trainer's per-step work). What was lost:

- **The LM head on every position.** TRL's `SFTTrainer` computes the loss through its fused LM head
  (`trl.trainer.utils.add_fused_lm_head`: per-token log-probabilities in tiles, never the whole logits). On a CUDA
  device it projects only the positions whose label is not -100; elsewhere it projects *every* position (fixed
  tile shapes for compilers) and folds each tile with a dozen elementwise passes, forward and again in the
  backward. With the loss on assistant tokens only (10-20% of an agent trajectory) that work is mostly thrown away:
  it was 31% of a step. `compact_lm_head` wraps the fused forward so that on CPU it projects the labelled positions
  only: the same loss, gradients, entropy and top-1 accuracy (`tests/stages/test_training.py` checks them against TRL's).
- **Spinning OpenMP threads.** GNU OpenMP (torch's on Linux) lets a thread that reaches a barrier spin for a while.
  On a machine whose cores other processes also want, a spinning thread holds a core while the thread it waits for
  is descheduled: with a test run beside it, training on 2 threads went 2-4x slower than on 1 thread.
  `prepare_cpu_process` (first thing in `train_student`, before torch loads) sets `OMP_WAIT_POLICY=PASSIVE` unless
  the environment sets a policy: measured in the same run on the loaded machine 1.4-2.7x the tokens/s of spinning
  threads, on the idle machine 1% fewer.
- **Threads.** torch takes `OMP_NUM_THREADS` (Snakemake sets it to the job's threads) or else OpenMP's default,
  which follows the CPU affinity but not a CPU quota (a container's `--cpus`, cgroup `cpu.max`): threads beyond
  the cores the job gets wait for each other at every barrier. `set_cpu_threads` sets torch's intra-op threads (MKL
  follows) to `cpu_threads()`. (On 2 idle cores 2 threads train at 1.86x the tokens/s of 1.) Inter-op threads are
  not used by eager training and are left alone.

Not done, measured or reasoned: packing or bucketing (batch size 1 has no padding; the CPU flash kernel does not
skip the blocks a block-diagonal mask hides, so packed examples would pay for attention across their boundaries),
bf16 (no bf16 arithmetic on AVX2: SDPA's backward ran 4x slower than in fp32), `torch.compile` (75 s of compiling,
then slower steps with dynamic shapes), eager attention (materialises the score matrix: 2.6x slower than SDPA at
3k tokens), gradient checkpointing (off by default; it only trades time for memory).
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any

from gymforge.runtime.cpus import cpu_threads

# Logits of at most this many elements (tokens x vocabulary) are computed at once: 128 MiB in float32. The offline
# student's 4,096-token vocabulary fits 8,192 trained tokens, a whole max_length; a larger vocabulary (SmolLM2's
# 49,152) is cut into token chunks whose logits are recomputed in the backward.
LOGITS_ELEMENTS = 1 << 25

def prepare_cpu_process() -> bool:
    """In a training process, before torch is imported: OpenMP threads that sleep at a barrier instead of spinning
    (`OMP_WAIT_POLICY=PASSIVE`, unless the environment sets a policy). GNU OpenMP (torch's on Linux) reads it once,
    when torch loads it. Returns whether it applies (not when torch was imported already)."""
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return True


def set_cpu_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count (MKL's follows) to `threads` (default: `cpu_threads()`); returns it."""
    import torch

    threads = cpu_threads() if threads is None else threads
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def _plain_head(config: Any) -> bool:
    """Whether the LM head is a plain projection: no logit scaling or softcapping, no router loss (MoE), not a
    vision-language wrapper. Anything else keeps TRL's own fused head."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config or getattr(text, "output_router_logits", False):
        return False
    scaling = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
    return all(getattr(text, name, None) is None for name in scaling)


def _head_chunk(hidden: Any, weight: Any, bias: Any, target: Any) -> tuple[Any, Any, Any]:
    """Log-probability of `target` under `hidden @ weight.T (+ bias)`, with the entropy and whether the target is
    the argmax (the first maximum, as TRL counts it) as non-differentiable extras."""
    import torch
    import torch.nn.functional as F

    logits = F.linear(hidden, weight, bias).float()
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        top1 = logits.argmax(-1) == target
    return picked, entropy, top1


def labelled_log_probs(hidden: Any, weight: Any, bias: Any, target: Any) -> tuple[Any, Any, Any]:
    """`_head_chunk` over the rows of `hidden` ([N, H], the labelled positions only), in token chunks of at most
    `LOGITS_ELEMENTS` logits; chunks beyond the first are recomputed in the backward, so memory stays bounded."""
    import torch
    from torch.utils.checkpoint import checkpoint

    rows = max(1, LOGITS_ELEMENTS // max(1, weight.shape[0]))
    if hidden.shape[0] <= rows:
        return _head_chunk(hidden, weight, bias, target)
    parts = [checkpoint(_head_chunk, hidden[i:i + rows], weight, bias, target[i:i + rows], use_reentrant=False)
             for i in range(0, hidden.shape[0], rows)]
    return tuple(torch.cat([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def compact_lm_head(model: Any) -> bool:
    """Make the fused LM head of TRL's `SFTTrainer` (`model(..., labels=..., fused_lm_head=True)`, installed by
    `add_fused_lm_head` on `model`, the PEFT base model under LoRA) project only the positions that have a label,
    as TRL does on CUDA. For a model trained on CPU (`build_trainer` installs it there only). Returns whether it was
    installed: not when `model` has no fused head (an older TRL) or its head is not a plain projection
    (`_plain_head`); then TRL's path runs unchanged."""
    try:
        from trl.trainer.utils import FusedCausalLMOutput
    except ImportError:
        return False
    fused = model.__dict__.get("forward")  # TRL binds its fused forward to the instance
    if fused is None or not _plain_head(model.config) or getattr(fused, "_gymforge_compact", False):
        return False

    @functools.wraps(type(model).forward)  # Trainer and generate read the forward's signature
    def forward(self: Any, *args: Any, fused_lm_head: bool = False, labels: Any = None, shift_labels: Any = None,
                num_items_in_batch: Any = None, **kwargs: Any) -> Any:
        if not fused_lm_head:
            return fused(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                         num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        head = self.get_output_embeddings()
        labels = labels.to(head.weight.device)
        mask = labels != -100
        picked, entropy, top1 = labelled_log_probs(hidden.to(head.weight.device)[mask], head.weight, head.bias,
                                                   labels[mask])

        def spread(values: Any) -> Any:  # zero at the ignored positions, as TRL's outputs are
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        log_probs = spread(picked)
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, entropy=spread(entropy),
                                   is_top1=spread(top1), label_mask=mask)

    forward._gymforge_compact = True  # type: ignore[attr-defined]
    model.forward = types.MethodType(forward, model)
    return True
