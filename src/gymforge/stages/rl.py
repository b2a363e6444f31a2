"""RL stage: on-policy RL of the SFT student on (micro-scale) verified tasks; rule `train_rl`, target `rl` (whose
rule `rl_plot`, step `rl-plot`, draws the reward curve for `snakemake --report`).

`train_rl` (the rule's step; `run_rl` with loaded tasks) runs `rl.iterations` iterations of:

1. serve the current policy through the benchmark's serving seam (`open_endpoint`: transformers on CPU,
   vLLM on GPUs) under a name that changes every iteration (no cached reply of an older policy is reused);
2. for `rl.tasks_per_iteration` tasks (chosen by `rl.task_sampling`: learning-frontier sampling from the tasks'
   recent pass rates, or round-robin; `gymforge.rl.frontier`), run `rl.group_size` episodes each
   through the shared `EpisodeRunner` (same sandboxes, agent loop, evaluation and audit as everywhere);
   a share `rl.improve_fraction` of them starts from the task's best previous solution with the
   improve prompt (`gymforge.rl.rollouts`);
3. score every episode (`gymforge.rl.rewards`), compute group-relative advantages per task, leave groups with zero
   reward variance out (`rl.drop_zero_variance`; an iteration without a group left skips its update and carries
   the checkpoint over), and update the policy with the clipped, KL-penalised, optionally duration-weighted loss
   (`gymforge.rl.grpo`) on the reply tokens of every request the loop sent;
4. write the iteration's checkpoint (`<out>/../.work/iter_<k>/`, with the optimizer state), the state
   file, and one row of `curve.json`, each atomically.

With `rl.gpus > 1` this process holds no model: step 3's update (and the checkpoint of step 4) runs in `rl.gpus`
worker processes, sharded with `rl.strategy` (`gymforge.rl.sharded`: `accelerate launch` with SFT's FSDP /
ZeRO-3 configs), after the iteration's server has stopped. `check_update_memory` refuses, before any rollout, a
plan whose update cannot fit the GPUs (`gymforge.rl.memory`).

Resume: `.work/state.json` names the last finished iteration; a rerun (after kill -9 too) loads that
iteration's checkpoint and optimizer and goes on with the next one, as long as its fingerprint (the
`seed` and `rl` config, the SFT checkpoint and the task list) is unchanged; otherwise it starts over.
Every iteration's seeds derive from (seed, iteration, slot, episode), and its task choice from (seed, iteration)
and the finished iterations' pass rates (kept in the state's curve rows), so a resumed run draws what an
uninterrupted one would. The declared outputs (the final checkpoint folder and `curve.json`) are
written at the end; `curve.json` is also rewritten after every iteration for watching a run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gymforge.benchmark.decontamination import dropped_items
from gymforge.core import atomic
from gymforge.runtime import tracking
from gymforge.core.config import EndpointConfig, GymforgeConfig, ModelSpec
from gymforge.core.records import derive_seed, text_hash
from gymforge.rl.rewards import Episode, episode_reward
from gymforge.llm.client import LLMClient
from gymforge.llm.serving import open_endpoint
from gymforge.report.rl_plots import plot_curve
from gymforge.rl import frontier, grpo
from gymforge.rl.backends import checkpoint_activations
from gymforge.rl.memory import GiB, advice, params_of, rl_update_memory
from gymforge.rl import sharded as sharded_update
from gymforge.rl.backends import checkpoint_files
from gymforge.rl.rollouts import EpisodePlan, improve_variant, load_task, run_episodes, solution_actions
from gymforge.stages.evaluation import checkpoint_tag
from gymforge.student import flops
from gymforge.tasks.episode import EpisodeRunner

log = logging.getLogger("gymforge.rl")

STATE = "state.json"
TRAJECTORIES = "trajectories"  # under .work/: each episode's .traj with its sampled tokens (`gymforge export-tokens`)


def work_dir(checkpoint_out: Path) -> Path:
    return Path(checkpoint_out).parent / ".work"


def iteration_dir(work: Path, iteration: int) -> Path:
    return work / f"iter_{iteration:04d}"


def fingerprint(cfg: GymforgeConfig, sft_checkpoint: Path, slots: list[str]) -> str:
    # every setting that changes what an iteration does; not `iterations`: a run may be extended or cut short
    view = cfg.rerun_view()["rl"]
    view.pop("iterations")
    return text_hash(json.dumps([cfg.seed, view], sort_keys=True) + checkpoint_tag(str(sft_checkpoint))
                     + ",".join(slots))


def choose_tasks(cfg: GymforgeConfig, iteration: int, tasks: list[Any], rows: list[dict[str, Any]]) -> list[Any]:
    """The `rl.tasks_per_iteration` tasks of one iteration (`rl.task_sampling`): learning-frontier sampling from
    the pass rates of the finished iterations (`rows`, their curve rows) with the iteration's own seed, or
    round-robin (`gymforge.rl.frontier`)."""
    rl = cfg.rl
    slots = [t.slot for t in tasks]
    if rl.task_sampling == "round_robin":
        picked = frontier.choose_round_robin(slots, iteration, rl.tasks_per_iteration)
    else:
        seed = cfg.seed if rl.seed is None else rl.seed
        picked = frontier.choose_frontier(slots, frontier.pass_history(rows), rl.tasks_per_iteration,
                                          random.Random(derive_seed(seed, "rl-tasks", iteration)),
                                          window=rl.frontier_window, floor=rl.frontier_floor)
    by_slot = {t.slot: t for t in tasks}
    return [by_slot[s] for s in picked]


def plan_iteration(cfg: GymforgeConfig, iteration: int, chosen: list[Any], best: dict[str, Any],
                   improve_root: Path) -> list[Any]:
    """The episodes of one iteration on its `chosen` tasks: which seeds, which start from the best solution."""
    rl = cfg.rl
    plans = []
    seed = cfg.seed if rl.seed is None else rl.seed
    for task in chosen:
        improving = round(rl.group_size * rl.improve_fraction) if task.slot in best else 0
        for k in range(rl.group_size):
            improve = k < improving
            yaml_path, root = task.task_yaml, task.tree
            if improve:
                yaml_path = improve_variant(task, best[task.slot], improve_root)
                root = yaml_path.parents[2]
            plans.append(EpisodePlan(episode_id=f"i{iteration:04d}-{task.slot}-e{k}", task=task,
                                     seed=derive_seed(seed, "rl", iteration, task.slot, k), improve=improve,
                                     task_yaml=yaml_path, root=root))
    return plans


def serve_and_collect(cfg: GymforgeConfig, policy_dir: Path, iteration: int, plans: list[Any], work: Path,
                      log_file: Path | None) -> list[tuple[Any, Any, float]]:
    """Serve `policy_dir` (the benchmark's seam) and run the planned episodes against it."""
    rl = cfg.rl
    serving = cfg.evaluate.serving.model_copy(update={"max_new_tokens": rl.max_new_tokens,
                                                      "temperature": rl.temperature, "gpus": rl.gpus})
    served_cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"serving": serving})})
    spec = ModelSpec(name="student-rl", source="checkpoint", model=str(policy_dir))
    served = f"student-rl-i{iteration}-{checkpoint_tag(str(policy_dir))}"
    runner = EpisodeRunner.for_config(cfg, 0)
    with open_endpoint(served_cfg, spec, checkpoint=str(policy_dir), served_name=served, log=log_file) as endpoint:
        config = EndpointConfig(provider="local", base_url=endpoint.base_url, model=endpoint.model,
                                temperature=rl.temperature, max_tokens=rl.max_new_tokens,
                                concurrency=rl.concurrency, token_ids=True)
        llm = LLMClient(config, stage="rl", cache_dir=cfg.cache / "llm", ledger_dir=cfg.results / "llm",
                        budget_usd=cfg.llm.budget_usd, base_url=endpoint.base_url)

        async def go() -> list[tuple[Any, Any, float]]:
            try:
                return await run_episodes(runner, llm, plans, max_steps=rl.max_steps, concurrency=rl.concurrency,
                                          work=work / "episodes", keep=work / TRAJECTORIES)
            finally:
                await llm.aclose()

        return asyncio.run(go())


Collector = Callable[[Path, int, list[Any]], list[tuple[Any, Any, float]]]


def _load_state(work: Path, stamp: str) -> dict[str, Any]:
    path = work / STATE
    if path.exists():
        try:
            state = json.loads(path.read_text())
        except ValueError:
            state = {}
        finished = state.get("finished", 0)
        if state.get("fingerprint") == stamp and (finished == 0 or iteration_dir(work, finished).exists()):
            return state
        log.info("RL state in %s is from other settings: starting over", work)
    shutil.rmtree(work, ignore_errors=True)
    return {"fingerprint": stamp, "finished": 0, "best": {}, "curve": []}


def _save_checkpoint(policy: Any, optimizer: Any, sft_checkpoint: Path, dest: Path) -> None:
    import torch

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    checkpoint_files(sft_checkpoint, tmp)
    policy.save_pretrained(str(tmp))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def check_update_memory(cfg: GymforgeConfig) -> None:
    """Refuse, before any rollout, an update that cannot fit the job's GPUs (`gymforge.rl.memory`, the figures of
    `gymforge estimate` with the device's real memory): it would fail only after the first iteration's episodes."""
    import torch

    if not cfg.rl.gpus or not torch.cuda.is_available():
        return
    capacity = torch.cuda.get_device_properties(0).total_memory / GiB
    params = params_of(cfg.train.student)
    memory = rl_update_memory(cfg, params, capacity)
    if memory is None or memory.fits:
        return
    raise RuntimeError(f"rl: the update of {cfg.train.student} needs ~{memory.total:.0f} GiB per GPU with "
                       f"{memory.note} (docs/rl.md, \"Memory of the update\"), more than this GPU's "
                       f"{capacity:.0f} GiB. {advice(cfg, params, capacity)}")


def update_models(reference_dir: Path, policy_dir: Path, learning_rate: float,
                  gradient_checkpointing: bool = False) -> tuple[Any, Any, Any]:
    """(reference, policy, optimizer) of an update on one device, the first GPU, else the CPU: the frozen reference
    in bf16 where the GPU has it (fp32 otherwise), the policy in fp32 with AdamW (fp32 master weights and moments);
    `gradient_checkpointing` (rl.gradient_checkpointing): the policy recomputes each decoder layer in the backward."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    reference = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=dtype).to(device).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    policy = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32).to(device).eval()
    if gradient_checkpointing:
        checkpoint_activations(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=learning_rate, weight_decay=0.0)
    return reference, policy, optimizer


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _curve_row(iteration: int, scored: list[dict[str, Any]], stats: dict[str, float], wall_s: float, *,
               chosen: list[str], groups: int, dropped: list[str], skipped: bool,
               rollout_s: float = 0.0) -> dict[str, Any]:
    durations = [d for e in scored for d in e["durations"]]
    rewards = [e["reward"] for e in scored]
    by_task: dict[str, list[float]] = {}
    for e in scored:
        by_task.setdefault(e["slot"], []).append(e["reward"])
    episodes = {slot: sum(1 for e in scored if e["slot"] == slot) for slot in chosen}
    passes = {slot: sum(1 for e in scored if e["slot"] == slot and e["passed"]) for slot in chosen}
    milestones = {}
    for name in ("ran_code", "artefact", "evaluated", "beat_baseline"):
        milestones[name] = round(sum(e["milestones"][name] for e in scored) / max(len(scored), 1), 4)
    update_s, update_tokens = wall_s - rollout_s, int(stats.get("update_tokens", 0))
    row = {
        "iteration": iteration,
        "mean_reward": round(_mean(rewards), 6),
        "valid_share": round(_mean([1.0 if e["valid"] else 0.0 for e in scored]), 4),
        "mean_duration_s": round(_mean(durations), 4),
        "kl": round(stats.get("kl", 0.0), 6),
        "loss": round(stats.get("loss", 0.0), 6),
        "clipped_share": round(stats.get("clipped", 0.0), 4),
        "episodes": len(scored),
        "improve_episodes": sum(1 for e in scored if e["improve"]),
        "flagged": sum(1 for e in scored if e["flagged"]),
        "samples": int(stats.get("samples", 0)),
        "optimizer_steps": int(stats.get("optimizer_steps", 0)),
        "milestone_shares": milestones,
        "task_mean_reward": {k: round(_mean(v), 6) for k, v in by_task.items()},
        # frontier sampling (gymforge.rl.frontier): the tasks chosen, and per task its scored episodes and passes
        "tasks": list(chosen),
        "task_episodes": episodes,
        "task_passes": passes,
        "task_pass_rate": {k: round(passes[k] / n, 4) if n else None for k, n in episodes.items()},
        # dynamic sampling: groups with scored episodes, those left out for zero reward variance, a skipped update
        "groups": groups,
        "groups_dropped_zero_variance": len(dropped),
        "zero_variance_tasks": list(dropped),
        "update_skipped": skipped,
        # token paths (gymforge.rl.grpo): samples trained on their sampled ids or on re-tokenized text, and the mean
        # |trainer - sampler| log-prob of the sampled ones' reply tokens with the share over rl.mismatch_threshold
        "token_paths": stats.get("token_paths", {"sampled": 0, "retokenized": 0}),
        "mismatch_abs_logprob": round(stats.get("mismatch_abs_logprob", 0.0), 6),
        "mismatch_share_over": round(stats.get("mismatch_share_over", 0.0), 6),
        "mismatch_tokens": int(stats.get("mismatch_tokens", 0)),
        # samples longer than rl.max_length: their prompt lost its start, their reply trains on an unseen context
        "samples_truncated": int(stats.get("samples_truncated", 0)),
        # where the iteration's time went: serving and episodes (scored), then the update and its checkpoint
        "rollout_s": round(rollout_s, 2),
        "update_s": round(update_s, 2),
        "wall_s": round(wall_s, 2),
        # the update's throughput: tokens its forward and backward passes took (each sample once an epoch) over update_s
        "update_tokens": update_tokens,
        "update_tokens_per_s": round(update_tokens / update_s, 1) if update_s > 0 else 0.0,
    }
    # model FLOPs utilisation over update_s, only where the update ran on one CUDA GPU with a known peak (`_update`)
    if stats.get("update_flops") and stats.get("peak_flops") and update_s > 0:
        row["mfu"] = round(stats["update_flops"] / update_s / stats["peak_flops"], 4)
    return row


def write_curve(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    atomic.write_json(path, {"iterations": rows, **meta})


def quarter_means(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Mean reward of the first and of the last quarter of the iterations (at least one each)."""
    if len(rows) < 2:
        return None
    q = max(1, len(rows) // 4)
    first = [r["mean_reward"] for r in rows[:q]]
    last = [r["mean_reward"] for r in rows[-q:]]
    return sum(first) / len(first), sum(last) / len(last)


def _score_episodes(cfg: GymforgeConfig, results: list[Any], best: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], list[Any]]:
    """Score an iteration's episodes and cut their action samples; a task's best valid, unflagged episode so far
    goes into `best` (what the next improve episodes start from)."""
    scored: list[dict[str, Any]] = []
    samples: list[Any] = []
    for plan, traj, wall in results:
        if traj is None:
            continue
        r = episode_reward(Episode.of(traj), plan.task.metric, cfg.rl.reward)
        actions = [s for s in traj.trajectory if not s.action.startswith("exit_")]
        scored.append({"episode_id": plan.episode_id, "slot": plan.task.slot, "improve": plan.improve,
                       "exit_status": traj.info.exit_status, "steps": len(actions), "wall_s": round(wall, 2),
                       "durations": [round(s.execution_time, 3) for s in actions], **r.as_dict(),
                       "passed": frontier.passed(r.as_dict())})
        episode_samples = grpo.action_samples(traj, len(scored) - 1)
        scored[-1]["token_paths"] = {"sampled": sum(1 for s in episode_samples if s.sampled is not None),
                                     "retokenized": sum(1 for s in episode_samples if s.sampled is None)}
        samples.extend(episode_samples)
        old = best.get(plan.task.slot)
        if r.valid and not r.flagged and (old is None or r.reward > old["reward"]):
            best[plan.task.slot] = {"episode_id": plan.episode_id, "reward": r.reward,
                                    "score": {plan.task.metric.metric: r.score},
                                    "actions": solution_actions(traj)}
    return scored, samples


@dataclass
class _Weighed:
    """An iteration's samples with their advantages and weights, and the groups they came from."""
    samples: list[Any]
    advantage: list[float]
    groups: dict[str, list[int]]
    dropped: list[str]
    kept: set[int]


def _weigh(cfg: GymforgeConfig, scored: list[dict[str, Any]], samples: list[Any]) -> _Weighed:
    """Group-relative advantages (the episodes of one task in this iteration form a group), dynamic sampling and
    duration weights."""
    rl = cfg.rl
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(scored):
        groups.setdefault(e["slot"], []).append(i)
    advantage = [0.0] * len(scored)
    for members in groups.values():
        for i, a in zip(members, grpo.group_advantages([scored[i]["reward"] for i in members]), strict=True):
            advantage[i] = a
    # dynamic sampling: a group whose rewards are all equal (advantage 0 throughout) is left out of the update
    dropped = [slot for slot, members in groups.items()
               if rl.drop_zero_variance and frontier.zero_variance([scored[i]["reward"] for i in members])]
    kept = {i for slot, members in groups.items() if slot not in dropped for i in members}
    if rl.drop_zero_variance:
        samples = [s for s in samples if s.episode in kept]
    weights = grpo.duration_weights([s.duration_s for s in samples], enabled=rl.duration_aware,
                                    floor_s=rl.duration_floor_s, max_weight=rl.duration_max_weight)
    for s, w in zip(samples, weights, strict=True):
        s.advantage, s.weight = advantage[s.episode], w
    if rl.drop_zero_variance:  # an episode exactly at its group's mean teaches nothing either
        samples = [s for s in samples if s.advantage != 0.0]
    return _Weighed(samples, advantage, groups, dropped, kept)


@dataclass
class _Trainer:
    """What one RL run updates with: the tokenizer and template, and (one device) the models and optimizer; with
    rl.gpus > 1 the update runs in worker processes, sharded (gymforge.rl.sharded), and this process holds no model."""
    tokenizer: Any
    template: Any
    sharded: bool
    reference: Any = None
    policy: Any = None
    optimizer: Any = None


def _update(cfg: GymforgeConfig, trainer: _Trainer, samples: list[Any], *, iteration: int, seed: int,
            policy_dir: Path, sft_checkpoint: Path, work: Path, log_file: Path | None) -> dict[str, Any]:
    """One iteration's policy update; the sharded workers write the next checkpoint themselves."""
    rl = cfg.rl
    update_seed = derive_seed(seed, "rl-update", iteration)
    if trainer.sharded:
        samples = sharded_update.tokenize_samples(samples, trainer.tokenizer, max_length=rl.max_length,
                                                  template=trainer.template)
        paths = grpo.path_counts(samples)
        stats = sharded_update.run_update(cfg, samples, policy_dir=policy_dir, reference_dir=sft_checkpoint,
                                          dest=iteration_dir(work, iteration + 1), folder=work / "update",
                                          update_seed=update_seed, torch_seed=derive_seed(seed, "rl-torch", iteration),
                                          log_file=log_file)
        stats["token_paths"], stats["samples_truncated"] = paths, _truncated(samples, rl.max_length)
        return stats
    # on a GPU, a chain's logits fit what the memory estimate allows one reply (gymforge.rl.memory); a CPU chains freely
    budget = rl.max_new_tokens + 1 if trainer.policy.device.type == "cuda" else None
    samples = grpo.prepare(samples, trainer.tokenizer, trainer.policy, trainer.reference, max_length=rl.max_length,
                           template=trainer.template, temperature=rl.temperature,
                           single_step=rl.epochs == 1 and rl.minibatches == 1, chain_budget=budget)
    stats = grpo.update(trainer.policy, trainer.optimizer, samples, epochs=rl.epochs, minibatches=rl.minibatches,
                        clip_eps=rl.clip_eps, kl_coef=rl.kl_coef, max_grad_norm=rl.max_grad_norm,
                        rng=random.Random(update_seed), temperature=rl.temperature, is_cap=rl.is_cap,
                        mismatch_threshold=rl.mismatch_threshold, chain_budget=budget)
    stats["token_paths"], stats["samples_truncated"] = grpo.path_counts(samples), _truncated(samples, rl.max_length)
    stats.update(_update_flops(trainer.policy, samples, stats.get("update_tokens", 0), budget))
    return stats


def _update_flops(policy: Any, samples: list[Any], tokens: int, budget: int | None) -> dict[str, float]:
    """The one-device update's model FLOPs (`gymforge.student.flops`: its tokens x FLOPs per token, attention at the
    passes' token-weighted mean length) and the peak FLOP/s of the GPU it ran on; nothing where that peak is not
    known (a CPU, an unlisted GPU): no made-up MFU."""
    peak = flops.device_peak_flops(next(policy.parameters()).device)
    if not peak or not tokens or not samples:
        return {}
    lengths = [len(chain[-1].input_ids) for chain in grpo.chains(samples, budget)]  # the sequences the passes took
    try:
        per_token = flops.flops_per_token(policy.config, flops.attention_length(lengths))
    except (AttributeError, TypeError):  # a config without a decoder's shape
        return {}
    return {"update_flops": per_token * tokens, "peak_flops": peak}


def _truncated(samples: list[Any], max_length: int) -> int:
    """How many of an update's samples lost the start of their prompt to `rl.max_length`, with a warning: they train
    on contexts the policy never saw (`grpo.tokenize`)."""
    n = grpo.truncated_count(samples)
    if n:
        log.warning("%d of %d samples are longer than rl.max_length %d and lose the start of their prompt: their "
                    "replies train on contexts the policy never saw (raise rl.max_length)", n, len(samples),
                    max_length)
    return n


def _finish(checkpoint_out: Path, curve_out: Path, final: Path, curve: list[dict[str, Any]],
            meta: dict[str, Any]) -> None:
    """Publish the last iteration's checkpoint (without optimizer state) and the curve with its run totals."""
    tmp = checkpoint_out.with_name(checkpoint_out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(final, tmp, ignore=shutil.ignore_patterns("optimizer.pt", "optimizer_deepspeed"))
    shutil.rmtree(checkpoint_out, ignore_errors=True)
    tmp.rename(checkpoint_out)
    quarters = quarter_means(curve)
    if quarters:
        meta["first_quarter_mean_reward"], meta["last_quarter_mean_reward"] = (round(q, 6) for q in quarters)
    meta["groups_dropped_zero_variance"] = sum(r.get("groups_dropped_zero_variance", 0) for r in curve)
    meta["updates_skipped"] = sum(1 for r in curve if r.get("update_skipped"))
    write_curve(curve_out, curve, meta)


def _open_trainer(cfg: GymforgeConfig, sft_checkpoint: Path, policy_dir: Path, *, resumed: bool) -> _Trainer:
    """The tokenizer and template, and with one device the reference, the policy (from policy_dir) and its optimizer
    (its saved state when resumed)."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(sft_checkpoint))
    trainer = _Trainer(tokenizer, grpo.training_template(tokenizer, cfg.train.student), sharded=cfg.rl.gpus > 1)
    # rl.gpus > 1: each update runs in rl.gpus worker processes, sharded (gymforge.rl.sharded); this process holds
    # no model. Otherwise one device: the first of the job's GPUs (the policy server holds them during rollouts),
    # else the CPU.
    if not trainer.sharded:
        trainer.reference, trainer.policy, trainer.optimizer = update_models(
            sft_checkpoint, policy_dir, cfg.rl.learning_rate, gradient_checkpointing=cfg.rl.gradient_checkpointing)
        if resumed and (policy_dir / "optimizer.pt").exists():
            trainer.optimizer.load_state_dict(torch.load(policy_dir / "optimizer.pt", weights_only=True,
                                                         map_location=trainer.policy.device))
    return trainer


def run_rl(cfg: GymforgeConfig, sft_checkpoint: Path, tasks: list[Any], checkpoint_out: Path, curve_out: Path,
             *, collect: Collector | None = None, log_file: Path | None = None) -> dict[str, Any]:
    """Run (or resume) the RL iterations; write the final checkpoint and curve.json. Returns the curve."""
    import torch

    rl = cfg.rl
    torch.set_num_threads(rl.threads)
    sft_checkpoint, checkpoint_out, curve_out = Path(sft_checkpoint), Path(checkpoint_out), Path(curve_out)
    tasks = [t for t in tasks if t is not None]
    if not tasks:
        raise RuntimeError("no verified RL task: nothing to train on (check rl.tasks and the verification reports)")
    slots = [t.slot for t in tasks]
    work = work_dir(checkpoint_out)
    stamp = fingerprint(cfg, sft_checkpoint, slots)
    state = _load_state(work, stamp)
    work.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed if rl.seed is None else rl.seed
    meta = {"student": cfg.train.name, "tasks": slots, "group_size": rl.group_size,
            "tasks_per_iteration": rl.tasks_per_iteration, "task_sampling": rl.task_sampling,
            "drop_zero_variance": rl.drop_zero_variance, "duration_aware": rl.duration_aware,
            "improve_fraction": rl.improve_fraction}

    check_update_memory(cfg)
    start = state["finished"]
    policy_dir = iteration_dir(work, start) if start else sft_checkpoint
    if start:
        log.info("resuming after iteration %d (checkpoint %s)", start - 1, policy_dir)
    trainer = _open_trainer(cfg, sft_checkpoint, policy_dir, resumed=bool(start))
    collect = collect or (lambda d, it, plans: serve_and_collect(cfg, d, it, plans, work, log_file))
    # the curve, per iteration, in the tracker too (trackio by default: results/trackio); a resumed run logs on
    tracker = tracking.open_tracker(cfg, name=f"rl-{cfg.train.name}-seed{seed}", kind="rl",
                                    config=cfg.rl.model_dump(mode="json"))

    for iteration in range(start, rl.iterations):
        t0 = time.monotonic()
        torch.manual_seed(derive_seed(seed, "rl-torch", iteration))
        chosen = choose_tasks(cfg, iteration, tasks, state["curve"])
        plans = plan_iteration(cfg, iteration, chosen, state["best"], work / "improve")
        scored, samples = _score_episodes(cfg, collect(policy_dir, iteration, plans), state["best"])
        rollout_s = time.monotonic() - t0
        weighed = _weigh(cfg, scored, samples)
        skipped = not weighed.kept  # no group left (all dropped, or no episode scored): the checkpoint is carried over
        if skipped:
            stats: dict[str, Any] = {}
            sharded_update.copy_policy(policy_dir, sft_checkpoint, iteration_dir(work, iteration + 1))
            log.info("iteration %d: no group with reward variance (%d dropped): update skipped", iteration,
                     len(weighed.dropped))
        else:
            stats = _update(cfg, trainer, weighed.samples, iteration=iteration, seed=seed, policy_dir=policy_dir,
                            sft_checkpoint=sft_checkpoint, work=work, log_file=log_file)
        if not trainer.sharded and not skipped:
            _save_checkpoint(trainer.policy, trainer.optimizer, sft_checkpoint, iteration_dir(work, iteration + 1))
        row = _curve_row(iteration, scored, stats, time.monotonic() - t0, chosen=[t.slot for t in chosen],
                         groups=len(weighed.groups), dropped=weighed.dropped, skipped=skipped, rollout_s=rollout_s)
        for e, a in zip(scored, weighed.advantage, strict=True):
            e["advantage"] = round(a, 6)
        atomic.write_json(work / "episodes" / f"iteration_{iteration:04d}.json", scored)
        policy_dir = iteration_dir(work, iteration + 1)
        state["curve"].append(row)
        state["finished"] = iteration + 1
        tracker.log({**{k: v for k, v in row.items() if k != "iteration"}, **row.get("token_paths", {})},
                    step=iteration)
        atomic.write_json(work / STATE, state)
        write_curve(curve_out, state["curve"], meta)
        for old in range(0, iteration + 1 - rl.keep_checkpoints + 1):
            shutil.rmtree(iteration_dir(work, old), ignore_errors=True)
        log.info("iteration %d: tasks %s, mean reward %.3f, valid %.0f%%, kl %.4f, %d samples, %d of %d groups "
                 "dropped (zero variance), %.0fs", iteration, ",".join(row["tasks"]), row["mean_reward"],
                 100 * row["valid_share"], row["kl"], row["samples"], row["groups_dropped_zero_variance"],
                 row["groups"], row["wall_s"])

    tracker.finish()
    _finish(checkpoint_out, curve_out, iteration_dir(work, state["finished"]), state["curve"], meta)
    return json.loads(curve_out.read_text())


def load_tasks(slots: list[str], reports: list[Path], envs: list[Path], proposals: list[Path]) -> list[Any]:
    return [load_task(s, r, e, p) for s, r, e, p in zip(slots, reports, envs, proposals, strict=True)]


def train_rl(cfg: GymforgeConfig, sft: Path, slots: list[str], reports: list[Path], envs: list[Path],
             proposals: list[Path], out: Path, curve_out: Path, log: Path | None = None,
             decontamination: Path | None = None) -> str:
    """Run (or resume) on-policy RL of the SFT student on the slots' tasks (one report, environment and
    proposal per slot, in order), but those the decontamination report dropped; write the final checkpoint to `out`
    and the reward curve to `curve_out`."""
    dropped = dropped_items(decontamination) if decontamination else {}
    pool = [item for item in zip(slots, reports, envs, proposals, strict=True) if item[0] not in dropped]
    for slot in sorted(set(slots) & dropped.keys()):
        logging.getLogger("gymforge.rl").info("RL pool: %s left out (%s)", slot, dropped[slot])
    if not pool:
        raise SystemExit(f"gymforge: every RL task ({', '.join(slots)}) overlaps the benchmark and was dropped by "
                         "decontamination: choose other rl.tasks")
    tasks = [load_task(slot, report, env, proposal) for slot, report, env, proposal in pool]
    curve = run_rl(cfg, Path(sft), tasks, Path(out), Path(curve_out), log_file=log)
    left_out = f"; {len(set(slots) & dropped.keys())} task(s) left out as benchmark overlaps" if dropped else ""
    return (f"{len(curve['iterations'])} RL iterations{left_out}: mean reward first quarter "
            f"{curve.get('first_quarter_mean_reward')} -> last quarter {curve.get('last_quarter_mean_reward')}; "
            f"{curve.get('groups_dropped_zero_variance', 0)} zero-variance groups dropped, "
            f"{curve.get('updates_skipped', 0)} updates skipped")


def rl_plot(curve: Path, png_out: Path) -> str:
    """The reward curve (`curve.json` of train_rl) as a figure for the report: mean reward and valid share per
    iteration."""
    plot_curve(Path(curve), Path(png_out))
    rows = json.loads(Path(curve).read_text()).get("iterations", [])
    return f"{png_out}: reward curve of {len(rows)} iterations"
