"""Per-GPU memory of the RL policy update (docs/rl.md, "Memory of the update"): `gymforge estimate` and `train_rl`.

A full-parameter update with AdamW keeps 16 bytes per parameter: fp32 master weights (4), fp32 Adam moments (4 + 4),
and the gradients plus the compute copy (FSDP2 here: fp32 gradient shard 4, bf16 weights gathered one layer at a
time; DeepSpeed ZeRO-3: bf16 weights 2 + bf16 gradients 2 beside the fp32 master 4). Sharded (`fsdp`, `deepspeed`)
all of it is divided by the GPUs; `ddp` and one device keep all of it on every GPU. Beside that:

- the frozen reference: bf16, 2 bytes per parameter. One device keeps it resident beside the policy; the sharded
  update takes the reference log-probs first and frees it before loading the policy (`gymforge.rl.sharded`), so
  it is not part of the update's peak;
- the gathered FSDP units: a decoder layer's bf16 weights (and the next one, prefetched) and its unsharded fp32
  gradients while they are reduced; the root unit (embeddings and output head) gathered likewise;
- activations of one sample (the update runs one request+reply of up to `rl.max_length` tokens at a time):
  with bf16 weights (FSDP2's compute copy, ZeRO-3) 34 x tokens x hidden bytes per decoder layer (Korthikanti et al.
  2022, attention scores excluded: flash attention); with fp32 weights under bf16 autocast (one device and `ddp`:
  `grpo.bf16_compute`) 80, measured: a one-sample update of Qwen3-0.6B on an H200 peaked 2.15 MiB higher per token
  from 2,048 to 16,384 tokens (`bench/gpu_check.py`, docs/training.md); with gradient checkpointing, one hidden state
  per layer plus one layer's full activations;
- the log-prob head: 16 bytes per position and vocabulary entry (logits, their fp32 copy divided by the temperature,
  log-softmax, and their gradients), on the reply's positions only (`rl.max_new_tokens` + 1: `grpo.reply_logprobs`);
- 3 GiB of CUDA context, communication buffers and allocator slack.

Shapes of the Qwen3 family come from their `config.json`; other students by name get an assumed shape (36 layers,
hidden size from the parameter count), so their figures are rougher.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

GiB = 2.0**30
GPU_MEMORY_GIB = 80.0  # an 80 GB H100/A100 (what `gymforge estimate` assumes; train_rl reads the real device)
OVERHEAD_GIB = 3.0
STATE_BYTES = 16  # per trained parameter: fp32 master + Adam m, v + gradients/compute copies (module docstring)
REFERENCE_BYTES = 2  # bf16
LOGIT_BYTES = 16  # per (position, vocabulary entry) of the log-prob head, forward and backward
ACTIVATION_BYTES = 34  # per token and hidden unit of one decoder layer, bf16 weights (Korthikanti et al.)
AUTOCAST_ACTIVATION_BYTES = 80  # the same, fp32 weights under bf16 autocast (measured: module docstring)
QWEN_VOCAB = 151936


@dataclass(frozen=True)
class Shape:
    params: float
    hidden: int
    layers: int
    vocab: int
    tied: bool
    known: bool = True  # from the model's config (else assumed from the parameter count)


# Qwen3 dense models (config.json of Qwen/Qwen3-*; parameter counts with embeddings)
QWEN3 = {
    "0.6b": Shape(0.596e9, 1024, 28, QWEN_VOCAB, True),
    "1.7b": Shape(2.03e9, 2048, 28, QWEN_VOCAB, True),
    "4b": Shape(4.02e9, 2560, 36, QWEN_VOCAB, True),
    "8b": Shape(8.19e9, 4096, 36, QWEN_VOCAB, False),
    "14b": Shape(14.8e9, 5120, 40, QWEN_VOCAB, False),
    "32b": Shape(32.8e9, 5120, 64, QWEN_VOCAB, False),
}


def params_of(student: str) -> float | None:
    """Parameter count read from a model name (`Qwen/Qwen3-4B` -> 4e9); None when the name does not say."""
    name = student.rstrip("/").rsplit("/", 1)[-1]
    found = re.findall(r"(\d+(?:\.\d+)?)\s*([BbMm])(?![A-Za-z])", name)
    if not found:
        return None
    value, unit = found[-1]
    return float(value) * (1e9 if unit in "Bb" else 1e6)


def shape_of(student: str, params: float | None) -> Shape | None:
    """The student's shape: a known Qwen3 size by name, else assumed from `params` (None: unknown)."""
    found = re.search(r"qwen3-(\d+(?:\.\d+)?b)(?![a-z0-9])", student.lower())
    if found and found.group(1) in QWEN3:
        return QWEN3[found.group(1)]
    if not params:
        return None
    layers = 36
    hidden = int(round(math.sqrt(params / (12 * layers)) / 128) * 128) or 128
    return Shape(params, hidden, layers, QWEN_VOCAB, False, known=False)


@dataclass
class UpdateMemory:
    """GiB per GPU of one RL update, by component."""

    gpus: int
    strategy: str
    sharded: bool
    gradient_checkpointing: bool
    states: float
    reference: float
    gathered: float
    activations: float
    logits: float
    overhead: float
    total: float
    capacity: float
    fits: bool
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def update_memory(shape: Shape, *, gpus: int, strategy: str, gradient_checkpointing: bool, max_length: int,
                  max_new_tokens: int, capacity_gib: float = GPU_MEMORY_GIB) -> UpdateMemory:
    """Peak GiB per GPU of the update `train_rl` runs with these settings (module docstring)."""
    n = max(gpus, 1)
    worker = gpus > 1  # the update runs in gymforge.rl.sharded's processes
    sharded = worker and strategy in ("fsdp", "deepspeed")
    checkpointing = gradient_checkpointing  # one device (`update_models`) or sharded (the workers)
    p = shape.params
    tokens = max_length
    head = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    layer = max(p - head, 0.0) / shape.layers
    if sharded:
        states = STATE_BYTES * p / n
        # a layer's bf16 weights and the prefetched next one, its fp32 gradients; the root unit (embeddings, head)
        gathered = layer * (2 + 2 + 4) + head * (2 + 4)
        act_bytes = 2  # a checkpointed hidden state: bf16
    else:
        states = (STATE_BYTES + (4 if worker else 0)) * p  # ddp: plus its fp32 gradient buckets
        gathered = 0.0
        act_bytes = 4  # fp32 (the residual stream of fp32 weights)
    reference = 0.0 if worker else REFERENCE_BYTES * p  # the workers take the reference log-probs first, then free it
    logit_positions = min(max_new_tokens + 1, tokens)
    per_layer = (ACTIVATION_BYTES if sharded else AUTOCAST_ACTIVATION_BYTES) * tokens * shape.hidden
    if checkpointing:
        activations = tokens * shape.hidden * act_bytes * shape.layers + per_layer
    else:
        activations = per_layer * shape.layers
    logits = LOGIT_BYTES * logit_positions * shape.vocab
    parts = [x / GiB for x in (states, reference, gathered, activations, logits)]
    total = sum(parts) + OVERHEAD_GIB
    how = (f"{strategy} over {n} GPUs" if sharded else f"ddp: a whole copy on each of {n} GPUs" if worker
           else "one device")
    note = f"{how}{', gradient checkpointing' if checkpointing else ''}"
    return UpdateMemory(gpus=gpus, strategy=strategy, sharded=sharded,
                        gradient_checkpointing=checkpointing, states=parts[0],
                        reference=parts[1], gathered=parts[2], activations=parts[3], logits=parts[4],
                        overhead=OVERHEAD_GIB, total=total, capacity=capacity_gib, fits=total <= capacity_gib,
                        note=note)


def fitting_plan(shape: Shape, *, max_length: int, max_new_tokens: int, capacity_gib: float = GPU_MEMORY_GIB,
                 max_gpus: int = 8) -> UpdateMemory | None:
    """The fewest GPUs (FSDP full shard, gradient checkpointing) whose update fits, up to `max_gpus`."""
    for n in range(2, max_gpus + 1):
        m = update_memory(shape, gpus=n, strategy="fsdp", gradient_checkpointing=True, max_length=max_length,
                          max_new_tokens=max_new_tokens, capacity_gib=capacity_gib)
        if m.fits:
            return m
    return None


def rl_update_memory(cfg: Any, params: float | None, capacity_gib: float = GPU_MEMORY_GIB) -> UpdateMemory | None:
    """The update memory of `cfg.rl` for its student (None when neither its shape nor its size is known)."""
    shape = shape_of(cfg.train.student, params)
    if shape is None:
        return None
    rl = cfg.rl
    return update_memory(shape, gpus=rl.gpus, strategy=rl.strategy, gradient_checkpointing=rl.gradient_checkpointing,
                         max_length=rl.max_length, max_new_tokens=rl.max_new_tokens, capacity_gib=capacity_gib)


def advice(cfg: Any, params: float | None, capacity_gib: float = GPU_MEMORY_GIB) -> str:
    """What fits instead, in config terms."""
    shape = shape_of(cfg.train.student, params)
    if shape is None:
        return ""
    plan = fitting_plan(shape, max_length=cfg.rl.max_length, max_new_tokens=cfg.rl.max_new_tokens,
                        capacity_gib=capacity_gib)
    if plan is None:
        return (f"no plan of up to 8 GPUs fits rl.max_length {cfg.rl.max_length}: lower rl.max_length or use more "
                "GPUs")
    return (f"rl.gpus: {plan.gpus} (or more), rl.strategy: fsdp, rl.gradient_checkpointing: true fits "
            f"(~{plan.total:.0f} of {capacity_gib:.0f} GiB per GPU)")
