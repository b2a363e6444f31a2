"""The RL policy update sharded over the `train_rl` job's GPUs (`rl.gpus > 1`; issue #24).

A full-parameter update of Qwen3-4B/8B does not fit one 80 GB GPU (docs/rl.md, "Memory of the update"), so with
`rl.gpus > 1` the `train_rl` driver (one process: serving, episodes, rewards, advantages, duration weights,
tokenization, as before) hands each iteration's update to `rl.gpus` worker processes and waits for them:

    accelerate launch --config_file gymforge/runtime/accelerate/<rl.strategy>.yaml --num_processes <rl.gpus>
        -m gymforge.rl.sharded <job.json>                                            (`launch_command`)

The workers start after the policy server of the iteration has stopped and exit before the next one starts,
so the server (vLLM) and the trainer never hold the GPUs at the same time. Per iteration each worker

1. loads the reference (the SFT checkpoint, bf16 on GPUs), sharded, and takes the reference log-probs of its share
   of the samples; the shares are gathered so every rank has all of them; the reference is then freed, so it never
   sits beside the trained policy (it adds nothing to the peak memory);
2. loads the policy (the iteration's checkpoint, fp32 master weights), sharded, and its optimizer state; takes the
   sampling policy's log-probs the same way (unless one epoch and one minibatch: then they are the update's own
   forward pass, detached, as in `grpo.prepare`);
3. runs `grpo.update`'s loop: the same chains of an episode's replies (`grpo.chains`: one forward and backward pass
   trains every reply of a chain), the same shuffled order of chains (`random.Random` of the same seed), the same
   minibatches; each minibatch's chains are dealt to the ranks (longest first to the least-loaded rank, by tokens),
   each rank back-propagates `world * w_k * loss_k / W` for its samples with `W = sum_k w_k` over the *whole*
   minibatch, and
   the backends average gradients over ranks, so the summed gradient is exactly the single process's
   `sum_k w_k * loss_k / W` (duration weights and advantages included; any split, uneven ones too). Every rank runs
   as many forward/backward passes as the busiest one (padding passes on a 2-token input, loss times 0), because
   sharded forwards and backwards are collective. Clipping uses the global gradient norm;
4. saves the updated policy: rank 0 writes the full state dict as a plain transformers checkpoint
   (`<work>/iter_<k>/`, with the tokenizer files, atomically) and the optimizer state in the single-process
   format (`optimizer.pt`, parameter indices in `model.parameters()` order: a run may change `rl.gpus` and resume).
   The driver then serves that folder, as with one device.

The log-probs (reference, sampling, trained) are taken on the reply's positions only (`logits_to_keep`): the mask
covers the last reply, so the logits of the prompt positions are never needed, and at 32k tokens x 152k vocabulary
they alone would take ~80 GB. The loss is `grpo.sample_loss` on those positions, which equals it on the full length
(the mask is zero before them).

Backends (`rl.strategy`, the accelerate config files SFT uses; `gymforge.rl.backends`):

- `fsdp`: torch FSDP2 (`fully_shard`) directly, one unit per decoder layer (the class named in `fsdp.yaml`,
  else the model's `_no_split_modules`) plus the root, reshard after forward (full shard); on GPUs bf16 compute with
  fp32 master weights, gradients reduced in fp32 (`MixedPrecisionPolicy`). Not accelerate's `Accelerator`:
  accelerate 1.15 turns FSDP on only for GPU-like devices (`AcceleratorState` keeps `MULTI_CPU` and silently drops
  the FSDP plugin with `--cpu`), so the sharded code path could not be tested on CPU processes with gloo; FSDP2
  itself runs on gloo. `accelerate launch` still starts the processes (torchrun's environment);
- `deepspeed`: accelerate's `Accelerator` with the ZeRO-3 plugin of `deepspeed.yaml` (the policy and its optimizer
  through `accelerator.prepare`, the reference through TRL's `prepare_deepspeed`); gradient accumulation boundaries
  set by hand, clipping by DeepSpeed (`--gradient_clipping`). Its optimizer state is DeepSpeed's own checkpoint
  (`optimizer_deepspeed/`); it cannot be resumed by the other strategies. Needs `pip install deepspeed` and GPUs;
  not exercised by the test suite (no deepspeed, no GPU there);
- `ddp`: torch DDP (every GPU holds the whole model: small students only).

Why not TRL's `GRPOTrainer` (trl 1.16.0, as locked): its `rollout_func` is called by the trainer inside its own
generation step with prompts from its dataset, and must return one prompt/completion token sequence per sample for
a fixed `num_generations` per prompt; advantages are then normalised over those groups. Our samples are per action
(one request and reply, many per episode, a varying number per episode) with the episode's group advantage and a
per-action duration weight; `env_mask` can hide environment tokens inside one long completion but has no per-token
or per-sample weight, and its losses (`grpo`: mean over each process's sequences; `dapo`/`bnpo`: over tokens)
cannot express `sum_k w_k * loss_k / sum_k w_k` over the whole batch. It would also bypass our serving seam and
episode runner. So the update is ours (`grpo.sample_loss`), sharded here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gymforge.core import atomic
from gymforge.runtime.launch import accelerate_launch
from gymforge.rl.backends import DEEPSPEED_STATE, OPTIMIZER, Backend, DeepSpeed, checkpoint_files, make_backend
from gymforge.rl.grpo import (chains, mismatch, mismatch_stats, reply_logprobs, reply_start, sample_loss,
                              span_logprobs, tokenize)

log = logging.getLogger("gymforge.rl.sharded")

# SFT's accelerate configs (gymforge/runtime/accelerate/<strategy>.yaml; `gymforge.stages.training` launches SFT with them)
JOB = "job.json"
SAMPLES = "samples.pt"
STATS = "stats.json"


# ---- the driver's side: the job and the command ------------------------------------------------------


def launch_command(cfg: Any, job: str | Path, *, port: int | None = None) -> list[str]:
    """The command that runs the update of `job` (a job.json): one plain process for `rl.gpus <= 1`, else
    `accelerate launch` with the `rl.strategy` config of SFT (`gymforge/runtime/accelerate/<strategy>.yaml`) and one
    process per GPU. `port`: the rendezvous port (default: accelerate's)."""
    rl = cfg.rl
    module = ["-m", "gymforge.rl.sharded", str(job)]
    if rl.gpus <= 1:
        return [sys.executable, *module]
    cmd = [*accelerate_launch(rl.strategy, rl.gpus, "rl.strategy"), "--num_machines", "1"]
    if port is not None:
        cmd += ["--main_process_port", str(port)]
    if rl.strategy == "deepspeed":
        # DeepSpeed clips inside its step; one micro-batch per forward (the worker sets the accumulation boundaries)
        cmd += ["--gradient_clipping", str(rl.max_grad_norm), "--gradient_accumulation_steps", "1"]
    return cmd + module


def tokenize_samples(samples: list[Any], tokenizer: Any, *, max_length: int, template: str | None) -> list[Any]:
    """`grpo.prepare` without the log-probs (the workers take them): the sampled ids (or the re-tokenized text), drop
    samples without a reply token."""
    kept = []
    for s in samples:
        tokenize(s, tokenizer, max_length, template)
        if sum(s.mask[1:]) == 0:
            continue
        s.start = reply_start(s.mask)
        kept.append(s)
    return kept


def write_job(folder: Path, samples: Sequence[Any], chain_budget: int | None = None, **settings: Any) -> Path:
    """job.json (settings and paths) and samples.pt (token ids, masks, advantages, weights, and the index of each
    sample's chain, `grpo.chains` with `chain_budget`) in `folder`."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    chain_of = {id(s): k for k, chain in enumerate(chains(samples, chain_budget)) for s in chain}
    torch.save([{"input_ids": torch.tensor(s.input_ids, dtype=torch.int64), "mask": torch.tensor(s.mask, dtype=torch.int8),
                 "advantage": float(s.advantage), "weight": float(s.weight), "chain": chain_of[id(s)],
                 "sampler": None if getattr(s, "sampler_logprobs", None) is None
                 else torch.tensor(s.sampler_logprobs, dtype=torch.float32)} for s in samples], folder / SAMPLES)
    (folder / STATS).unlink(missing_ok=True)
    job = {**{k: str(v) if isinstance(v, Path) else v for k, v in settings.items()},
           "samples": str(folder / SAMPLES), "stats": str(folder / STATS)}
    atomic.write_json(folder / JOB, job)
    return folder / JOB


def run_update(cfg: Any, samples: list[Any], *, policy_dir: Path, reference_dir: Path, dest: Path, folder: Path,
               update_seed: int, torch_seed: int, log_file: Path | None = None) -> dict[str, float]:
    """Run one iteration's update of the tokenized `samples` on `rl.gpus` processes (`launch_command`); the
    workers write the updated checkpoint to `dest`. Returns the update's statistics (as `grpo.update`'s)."""
    rl = cfg.rl
    if not samples:  # nothing to learn: the next checkpoint is this one (no worker launch, no model load)
        copy_policy(policy_dir, reference_dir, dest)
        return {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "samples": 0, "optimizer_steps": 0}
    # the workers' GPUs hold the log-prob head's logits for one reply's positions (gymforge.rl.memory): so do chains
    job = write_job(folder, samples, chain_budget=rl.max_new_tokens + 1, policy=policy_dir, reference=reference_dir,
                    dest=dest, tokenizer_files=reference_dir,
                    strategy=rl.strategy, learning_rate=rl.learning_rate, epochs=rl.epochs, minibatches=rl.minibatches,
                    clip_eps=rl.clip_eps, kl_coef=rl.kl_coef, max_grad_norm=rl.max_grad_norm,
                    is_cap=rl.is_cap, mismatch_threshold=rl.mismatch_threshold,
                    temperature=rl.temperature, single_step=rl.epochs == 1 and rl.minibatches == 1,
                    update_seed=update_seed, torch_seed=torch_seed, threads=rl.threads,
                    gradient_checkpointing=rl.gradient_checkpointing)
    cmd = launch_command(cfg, job, port=_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": str(rl.threads), "TOKENIZERS_PARALLELISM": "false"}
    log.info("sharded update of %d samples on %d processes (%s)", len(samples), rl.gpus, rl.strategy)
    with open(log_file, "a") if log_file else contextlib.nullcontext() as out:  # type: ignore[attr-defined]
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
    if proc.returncode != 0:
        raise RuntimeError(f"the sharded RL update failed (exit status {proc.returncode}): {' '.join(cmd)}"
                           + (f"; see {log_file}" if log_file else ""))
    return json.loads((folder / STATS).read_text())


def copy_policy(policy_dir: Path, tokenizer_files: Path, dest: Path) -> None:
    """`dest` as a copy of the checkpoint `policy_dir` (weights, config, optimizer state), atomically."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    checkpoint_files(tokenizer_files, tmp)
    for f in Path(policy_dir).iterdir():
        if f.is_dir() and f.name == DEEPSPEED_STATE:
            shutil.copytree(f, tmp / f.name)
        elif f.is_file() and (f.name.endswith((".safetensors", ".bin", ".safetensors.index.json")) or f.name in
                              ("config.json", "generation_config.json", OPTIMIZER)):
            shutil.copy2(f, tmp / f.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the plan: minibatches and shares ----------------------------------------------------------------


def minibatch_plan(n: int, *, epochs: int, minibatches: int, rng: random.Random) -> list[list[int]]:
    """The chain indices (`grpo.chains`) of every optimizer step, in order: exactly `grpo.update`'s (one shuffle per
    epoch)."""
    steps = []
    for _ in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        size = math.ceil(len(order) / minibatches)
        steps.extend(order[start:start + size] for start in range(0, len(order), size))
    return steps


def deal(indices: Sequence[int], lengths: Sequence[int], world: int) -> list[list[int]]:
    """Split `indices` over `world` ranks: longest first, each to the rank with the fewest tokens so far (ties: the
    lowest rank). Deterministic, so every rank computes the same split."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += lengths[i]
    return shares


# ---- the worker ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    input_ids: Any  # 1-D int64 tensor on the device
    mask: Any  # ids[1:]-aligned mask from the reply's first token (a tensor on the device)
    start: int
    advantage: float
    weight: float
    old: Any = None  # sampling policy's log-probs from `start` (None: single step, the update's own detached)
    chain: int = 0  # its chain (`grpo.chains`, computed by the driver): samples of one chain share a forward pass
    ref: Any = None
    sampler: Any = None  # the sampler's log-probs from `start` (sampled-token samples), else None

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])


def load_samples(path: Path, device: Any) -> list[Sample]:
    import torch

    out = []
    for i, row in enumerate(torch.load(path, weights_only=True)):
        mask = [int(m) for m in row["mask"].tolist()]
        start = reply_start(mask)
        sampler = row.get("sampler")
        out.append(Sample(input_ids=row["input_ids"].to(device), start=start,
                          mask=torch.tensor(mask[1:][start:], device=device), advantage=row["advantage"],
                          weight=row["weight"], sampler=None if sampler is None else sampler.to(device),
                          chain=int(row.get("chain", -1 - i))))  # a file without chains: one pass per sample
    return out


def chain_units(samples: list[Sample]) -> list[list[int]]:
    """The sample indices of each chain, in order; each sample's ids must begin with all of the previous one's."""
    import torch

    units: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        unit = units.setdefault(s.chain, [])
        if unit:
            prev = samples[unit[-1]]
            if not (s.tokens > prev.tokens and torch.equal(s.input_ids[:prev.tokens], prev.input_ids)):
                raise ValueError(f"sample {i} does not extend the previous sample of its chain {s.chain}")
        unit.append(i)
    return list(units.values())


def unit_logprobs(model: Any, unit: Sequence[Sample], temperature: float) -> list[Any]:
    """Each sample's reply log-probs (from its `start`) from one forward pass over its chain's last sample."""
    return span_logprobs(model, unit[-1].input_ids, [(s.start, s.tokens - 1) for s in unit], temperature)


def _dummy(samples: list[Sample]) -> Any:
    return samples[0].input_ids[:2]


def sharded_logprobs(backend: Backend, model: Any, samples: list[Sample], temperature: float) -> list[Any]:
    """Every sample's reply log-probs under `model`: each rank takes its share of the chains (dealt by tokens), one
    pass per chain, padding passes keep the ranks' forward counts equal, and the shares are gathered (CPU tensors,
    then moved to the device)."""
    import torch

    units = chain_units(samples)
    shares = deal(range(len(units)), [samples[u[-1]].tokens for u in units], backend.world)
    mine = shares[backend.rank]
    passes = max(len(share) for share in shares)
    model.eval()
    got: dict[int, Any] = {}
    with torch.no_grad():
        for k in range(passes):
            if k < len(mine):
                unit = units[mine[k]]
                for i, lp in zip(unit, unit_logprobs(model, [samples[i] for i in unit], temperature), strict=True):
                    got[i] = lp.cpu()
            else:
                reply_logprobs(model, _dummy(samples), 0, temperature)
    merged: dict[int, Any] = {}
    for part in backend.gather(got):
        merged.update(part)
    return [merged[i].to(backend.device) for i in range(len(samples))]


def sharded_update(backend: Backend, policy: Any, optimizer: Any, samples: list[Sample], *, epochs: int,
                   minibatches: int, clip_eps: float, kl_coef: float, max_grad_norm: float, rng: random.Random,
                   temperature: float = 1.0, is_cap: float = 2.0, mismatch_threshold: float = 0.1) -> dict[str, float]:
    """`grpo.update` with each minibatch dealt over the ranks (module docstring); the same statistics."""
    if not samples:
        return {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "samples": 0, "optimizer_steps": 0, "update_tokens": 0,
                **mismatch_stats(0.0, 0.0, 0.0)}
    import torch

    totals = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # loss, kl, clipped, count, |delta log-prob|, over, tokens
    seen: set[int] = set()
    steps = 0
    backend.train(policy)
    units = chain_units(samples)
    lengths = [samples[u[-1]].tokens for u in units]  # a chain's pass reads its last sample
    for batch in minibatch_plan(len(units), epochs=epochs, minibatches=minibatches, rng=rng):
        weight_sum = sum(samples[i].weight for u in batch for i in units[u]) or 1.0
        shares = deal(batch, lengths, backend.world)
        mine = shares[backend.rank]
        passes = max(len(share) for share in shares)
        backend.zero_grad(policy, optimizer)
        for k in range(passes):
            last = k == passes - 1
            with backend.micro_step(policy, last):
                if k < len(mine):
                    unit = units[mine[k]]
                    losses = []
                    for i, new_lp in zip(unit, unit_logprobs(policy, [samples[i] for i in unit], temperature),
                                         strict=True):
                        s = samples[i]
                        old_lp = new_lp.detach() if s.old is None else s.old
                        if s.sampler is not None and i not in seen:
                            seen.add(i)
                            for j, v in enumerate(mismatch(old_lp, s.sampler, s.mask, mismatch_threshold)):
                                totals[4 + j] += v
                        loss, kl, clipped = sample_loss(new_lp, old_lp, s.ref, s.mask, s.advantage,
                                                        clip_eps=clip_eps, kl_coef=kl_coef, sampler_lp=s.sampler,
                                                        is_cap=is_cap)
                        losses.append(loss * (s.weight * backend.world / weight_sum))
                        totals[0] += float(loss.detach())
                        totals[1] += float(kl)
                        totals[2] += float(clipped)
                        totals[3] += 1
                    backend.backward(policy, torch.stack(losses).sum(), last)
                else:  # a padding pass: the collectives of a forward and backward, no gradient
                    backend.backward(policy, reply_logprobs(policy, _dummy(samples), 0, temperature).sum() * 0.0, last)
        backend.step(policy, optimizer, max_grad_norm)
        steps += 1
    policy.eval()
    loss, kl, clipped, count, gap, over, tokens = backend.sum(totals)
    count = max(count, 1.0)
    return {"loss": loss / count, "kl": kl / count, "clipped": clipped / count, "samples": len(samples),
            "optimizer_steps": steps, "update_tokens": sum(lengths) * epochs,  # each chain once an epoch, no padding
            **mismatch_stats(gap, over, tokens)}


def run_job(job_file: str | Path) -> dict[str, float]:
    """The worker: every process of the launch runs this on the same job.json (module docstring)."""
    import torch

    job = json.loads(Path(job_file).read_text())
    torch.set_num_threads(int(job.get("threads", 1)))
    backend = make_backend(job["strategy"])
    try:
        return _run(backend, job)
    finally:
        backend.close()


def _run(backend: Backend, job: dict[str, Any]) -> dict[str, float]:
    import torch

    t0 = time.monotonic()
    torch.manual_seed(int(job["torch_seed"]))
    samples = load_samples(Path(job["samples"]), backend.device)
    temperature = float(job["temperature"])
    if samples:
        reference = backend.load(Path(job["reference"]), trainable=False)
        for s, lp in zip(samples, sharded_logprobs(backend, reference, samples, temperature), strict=True):
            s.ref = lp
        del reference
        backend.free()
    t_ref = time.monotonic()
    policy = backend.load(Path(job["policy"]), trainable=True,
                          gradient_checkpointing=bool(job.get("gradient_checkpointing")))
    if isinstance(backend, DeepSpeed):
        policy, optimizer = backend.prepare(policy, float(job["learning_rate"]))
    else:
        optimizer = backend.optimizer(policy, float(job["learning_rate"]))
    resumed = backend.load_optimizer(policy, optimizer, Path(job["policy"]))
    if samples and not job["single_step"]:
        for s, lp in zip(samples, sharded_logprobs(backend, policy, samples, temperature), strict=True):
            s.old = lp
    stats = sharded_update(backend, policy, optimizer, samples, epochs=int(job["epochs"]),
                           minibatches=int(job["minibatches"]), clip_eps=float(job["clip_eps"]),
                           kl_coef=float(job["kl_coef"]), max_grad_norm=float(job["max_grad_norm"]),
                           rng=random.Random(int(job["update_seed"])), temperature=temperature,
                           is_cap=float(job.get("is_cap", 2.0)),
                           mismatch_threshold=float(job.get("mismatch_threshold", 0.1)))
    t_update = time.monotonic()
    backend.save(policy, optimizer, Path(job["dest"]), Path(job["tokenizer_files"]))
    stats = {**stats, "world_size": backend.world, "reference_s": round(t_ref - t0, 2),
             "update_s": round(t_update - t_ref, 2), "save_s": round(time.monotonic() - t_update, 2),
             "optimizer_resumed": resumed}
    if backend.main:
        atomic.write_json(Path(job["stats"]), stats)
        log.info("sharded update on %d processes: %d samples, %d optimizer steps, loss %.4f, kl %.4f (%.0fs)",
                 backend.world, stats["samples"], stats["optimizer_steps"], stats["loss"], stats["kl"],
                 time.monotonic() - t0)
    return stats


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        raise SystemExit("usage: python -m gymforge.rl.sharded JOB.json (normally started by accelerate launch)")
    logging.basicConfig(level=logging.INFO if int(os.environ.get("RANK", "0")) == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per rank and model: noise in the job log
    run_job(argv[0])


if __name__ == "__main__":
    main()
