"""`gymforge estimate`: what a config will cost before anything runs.

Per stage it projects LLM calls, prompt, completion and reasoning tokens, cost (at the config's prices), GPU-hours
(what the jobs declare: verification jobs, micro tasks and rollout shards x `trajectories.gpus` x their wall when
the tasks' code needs a GPU, training, RL, served models in evaluation) and CPU-hours of the jobs that run task code in the sandbox. Counts come from the config by arithmetic (the same
formulas the Snakefile uses: ceil(n / batch_size) topic batches, ceil(per_task / shard_size) shards per task,
models x tasks x runs_per_task evaluation runs), never from a Snakemake DAG, so a paper-scale plan (hundreds of
thousands of jobs) is priced in well under a second.

Per-item averages (calls per item, tokens per call, steps per rollout, seconds per step, CPU seconds per item) and
funnel yields (kept topics per slot, verified tasks per slot, kept trajectories per rollout) are measured from a
pilot run when one is given (`gymforge.tools.pilot`; `--results`, default the config's `results_dir` when it has
data): tokens per call from the LLM ledger (`llm/calls.jsonl`) and the item records, calls per item from the
records, steps/timings/tokens per rollout from (a sample of) the rollout shards, yields from the stage records and
`sft/stats.json`, CPU seconds from the Snakemake benchmark files. Whatever the pilot does not cover falls back to
the table in `estimate_constants.yaml` (`DEFAULTS`), each entry with its source: MLGym's released frontier-model
runs for the agent loop (steps, tokens per call, reasoning tokens, trajectory lengths), the offline run for the
generation stages, the paper for yields, stated assumptions otherwise. The report names the source of every constant
it used, and of the whole (`constants_source`: "pilot run at <path>" or "MLGym released runs").

Reasoning tokens: a reasoning teacher (OpenAI's o-series and GPT-5 class, by the endpoint's `token_param`,
`reasoning_effort` or its model's name) writes hidden tokens that are billed as output tokens. Every teacher call's
visible completion tokens are multiplied by `reasoning_per_completion` (hidden per visible token; from the pilot's
ledger, else MLGym's o-series runs; `--reasoning-ratio` sets it, 0 prices none).

GPU tasks: a slot's verification job, its micro task and its rollout shards ask for `trajectories.gpus` only when
its task's code needs a GPU (their `resources:` call `gymforge.runtime.resources.verification`, `micro` and `shard`,
which read the slot's record with `record_gpus`). Tasks do not exist yet, so the estimate hands `record_gpus` the
record of each task the config can generate (`task_gpus`): the entrypoints the teacher is offered
(`gymforge.tasks.files.TEACHER_ENTRYPOINTS`, never LMSubmissionTasks) and, for `topics.kind: post_training`,
`post_training.base_model` or else a task spec's default base (the CPU build; the teacher is not asked to pick one).
Research tasks and post-training tasks on the CPU base thus get no GPU-hours in those stages; post-training tasks on
a GPU base get them for every verification job (the teacher episode and its repairs: a teacher call and a run of the
task's code each), micro task (`micro_exec_steps_per_item` runs of its code, no teacher) and shard.

Known limits: prices of served students are $0 (their cost is GPU time); steps per rollout are capped at the
config's `max_steps` (+1 for the auto-submission) but never extrapolated upward; the generation stages' per-call
constants come from the offline teacher, whose replies are shorter than a real teacher's.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter

from gymforge.core import plan
from gymforge.core.config import EndpointConfig, GymforgeConfig, Price, layered_config, validate_config
from gymforge.rl.memory import advice, params_of, rl_update_memory
from gymforge.benchmark.suite import SUITES, BenchmarkError, mlgym_tasks
from gymforge.core.plan import SERVED_SOURCES
from gymforge.runtime.resources import SPEC_FILE, record_gpus
from gymforge.tasks.files import TEACHER_ENTRYPOINTS
from gymforge.stages.sft import resolve_unit
from gymforge.tasks.posttraining import PostTrainingSpec
from gymforge.tools.pilot import Measured, has_data, measure

# ---- default constants ----------------------------------------------------------------------------------


class Constant(BaseModel):
    """One default constant of the estimate and where it comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    source: Literal["mlgym", "offline", "paper", "datasheet", "assumption"]
    note: str


CONSTANTS_FILE = Path(__file__).with_name("estimate_constants.yaml")


def load_defaults(path: Path = CONSTANTS_FILE) -> dict[str, Constant]:
    """The table of default constants (`estimate_constants.yaml`), validated."""
    return TypeAdapter(dict[str, Constant]).validate_python(yaml.safe_load(path.read_text()))


DEFAULTS = load_defaults()
GPU_PEAK_FLOPS = DEFAULTS["gpu_peak_flops"].value  # peak dense bf16 FLOP/s of one H100 SXM
TRAIN_MFU = DEFAULTS["train_mfu"].value

# What each constant's `source` stands for in the report ("pilot", "option" and "config" are not in the table).
SOURCE_NAMES = {"pilot": "pilot run at {results}", "mlgym": "MLGym released runs",
                "offline": "offline run of config.yaml", "paper": "the paper", "datasheet": "vendor datasheet",
                "assumption": "assumption", "option": "command-line option", "config": "the config"}

MLGYM_TASKS = 13  # MLGym-Bench's 13 tasks, used when the checkout is not at hand

# Model names of reasoning models whose hidden tokens are billed as output: OpenAI's o-series and GPT-5 class,
# DeepSeek-R1, and models that say so in their name.
REASONING_NAME = re.compile(r"(^|/)(o[1-9]|gpt-5)|reason|think|(^|[-/_])r1($|[-_:])", re.IGNORECASE)


def reasoning_teacher(endpoint: EndpointConfig, *models: str | None) -> str | None:
    """Why the teacher counts as a reasoning model (its hidden tokens billed as output), or None."""
    if getattr(endpoint, "token_param", None) == "max_completion_tokens":
        return "llm.teacher.token_param is max_completion_tokens"
    effort = getattr(endpoint, "reasoning_effort", None)
    if effort not in (None, "none"):
        return f"llm.teacher.reasoning_effort is {effort}"
    if getattr(endpoint, "offline_endpoint", None) == "reasoning":
        return "the offline teacher imitates a reasoning endpoint"
    for name in (endpoint.model, *models):
        if name and REASONING_NAME.search(name):
            return f"the model name {name}"
    return None


# ---- the projection -------------------------------------------------------------------------------------


@dataclass
class StageEstimate:
    name: str
    items: float
    unit: str
    calls: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0  # visible
    reasoning_tokens: float = 0.0  # hidden, billed as output
    cost_usd: float = 0.0
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    note: str = ""

    def price(self, price: Price) -> None:
        self.cost_usd += price.cost(self.prompt_tokens, self.completion_tokens + self.reasoning_tokens)


class Constants:
    """The value each constant takes: the option's where one is given, else measured where the pilot has it, else
    the default; `used` records each with its source."""

    def __init__(self, measured: Measured | None, train_student: str,
                 options: dict[str, tuple[float, str, str]] | None = None) -> None:
        self.used: dict[str, dict[str, Any]] = {}
        self.measured = measured
        self.train_student = train_student
        self.options = options or {}

    def __call__(self, key: str) -> float:
        m = self.measured
        usable = m is not None and key in m.values
        if usable and key == "train_tokens_per_s_per_gpu" and m.notes.get("_train_student") != self.train_student:
            usable = False  # another student's throughput says nothing about this one
        if key in self.options:
            value, source, note = self.options[key]
        elif usable:
            value, source, note = m.values[key], "pilot", m.notes[key]
        else:
            d = DEFAULTS[key]
            value, source, note = d.value, d.source, d.note
        self.used[key] = {"value": value, "source": source, "note": note}
        return value

    def source_summary(self) -> dict[str, Any]:
        """Which sources the used constants came from: the leading one (a pilot when it gave any, else MLGym's
        runs) and a count per source, by name."""
        results = self.measured.results if self.measured is not None else None
        counts: dict[str, int] = {}
        for u in self.used.values():
            name = SOURCE_NAMES[u["source"]].format(results=results)
            counts[name] = counts.get(name, 0) + 1
        pilot = SOURCE_NAMES["pilot"].format(results=results)
        primary = pilot if pilot in counts else SOURCE_NAMES["mlgym"]
        return {"primary": primary, "counts": counts}


def _eval_tasks(cfg: GymforgeConfig) -> tuple[int, str]:
    ev = cfg.evaluate
    if ev.tasks is not None:
        return len(ev.tasks), "evaluate.tasks"
    if ev.benchmark in SUITES:
        return len(SUITES[ev.benchmark]), ("the built-in suite" if ev.benchmark == "builtin" else
                                           "the built-in post-training suite")
    root = Path(ev.mlgym_root or "")
    try:
        return len(mlgym_tasks(root)), f"MLGym tasks found in {root}"  # by their id field, as the plan finds them
    except BenchmarkError:
        return MLGYM_TASKS, f"MLGym's {MLGYM_TASKS} tasks (checkout {root} not found or incomplete)"


def _reasoning(cfg: GymforgeConfig, c: Constants, option: float | None) -> dict[str, Any]:
    """Hidden reasoning tokens per visible completion token of the teacher: the option, the pilot's, MLGym's for a
    reasoning teacher, else none."""
    why = reasoning_teacher(cfg.llm.teacher, cfg.trajectories.model)
    key = "reasoning_per_completion"
    measured = c.measured is not None and key in c.measured.values
    if option is None and not measured and why is None:
        c.options[key] = (0.0, "config", f"{cfg.llm.teacher.model} is not a reasoning model (by llm.teacher's "
                          "token_param, reasoning_effort and the model name): no hidden tokens priced; "
                          "--reasoning-ratio sets it")
    elif option is not None:
        c.options[key] = (option, "option", "--reasoning-ratio")
    ratio = c(key)
    return {"ratio": ratio, "source": c.used[key]["source"], "reasoning_teacher": why}


def _generation_stages(cfg: GymforgeConfig, c: Constants) -> tuple[list[StageEstimate], dict[str, float]]:
    """Topics and the per-slot stages (proposals, configs, code, verification), and the plan's counts. A verification
    job holds `task_gpus` GPUs (what `resources.verification` asks for the slot's task) for its wall time: its
    teacher calls, each followed by a run of the task's code (an episode step, or the baseline and evaluation again
    after a repair)."""
    n = cfg.topics.n
    # topics: batch b lists every topic kept before it in its prompt
    batches = plan.n_batches(cfg)
    kept_topics = n * c("topics_kept_per_slot")
    seen_per_batch = cfg.topics.batch_size * c("topics_kept_per_slot")
    calls_per_batch = c("topics_calls_per_batch")
    seen_total = sum(min(b * seen_per_batch, kept_topics) for b in range(batches))
    st = StageEstimate("topics", batches, "batches")
    st.calls = batches * calls_per_batch
    st.prompt_tokens = calls_per_batch * (batches * c("topics_prompt_base") + seen_total * c("topics_prompt_per_seen"))
    st.completion_tokens = st.calls * cfg.topics.batch_size * c("topics_completion_per_topic")
    st.note = f"{n:,} slots -> {kept_topics:,.0f} kept topics"
    stages = [st]

    # per-slot stages: items reaching each stage
    reach = {"proposals": kept_topics, "configs": n * c("proposals_ok_per_slot"),
             "code": n * c("configs_ok_per_slot"), "verification": n * c("code_ok_per_slot")}
    out_of = {"proposals": n * c("proposals_ok_per_slot"), "configs": n * c("configs_ok_per_slot"),
              "code": n * c("code_ok_per_slot"), "verification": n * c("verified_per_slot")}
    for name, items in reach.items():
        st = StageEstimate(name, items, "tasks" if name != "proposals" else "topics")
        st.calls = items * c(f"{name}_calls_per_item")
        st.prompt_tokens = st.calls * c(f"{name}_prompt_per_call")
        st.completion_tokens = st.calls * c(f"{name}_completion_per_call")
        if name in ("code", "verification"):
            st.cpu_hours = items * c(f"{name}_cpu_s_per_item") / 3600
        st.note = f"-> {out_of[name]:,.0f} ok" + (" (verified tasks)" if name == "verification" else "")
        if name == "verification":
            gpus, why = task_gpus(cfg)
            job_wall_s = c("verification_calls_per_item") * (c("llm_s_per_call") + c("rollout_exec_s_per_step"))
            st.gpu_hours = items * gpus * job_wall_s / 3600
            st.note += f"; {items:,.0f} jobs of ~{job_wall_s / 3600:.2f} h, {gpus} GPU each: {why}"
        stages.append(st)
    return stages, {"topic_batches": batches, "kept_topics": kept_topics, "verified_tasks": out_of["verification"]}


def _planned_record(entrypoint: str, base: str | None) -> dict[str, Any]:
    """The starter-code record of a generated task as `resources.record_gpus` reads it: its entrypoint and, for a
    post-training task (`base` not None), the post_training.yaml naming its base."""
    files = {f"mlgym/{SPEC_FILE}": yaml.safe_dump({"base_model": base})} if base is not None else {}
    return {"status": "ok", "entrypoint": entrypoint, "files": files}


def task_gpus(cfg: GymforgeConfig) -> tuple[int, str]:
    """GPUs a generated task's verification job, micro task and rollout shards ask for, and why: what the workflow's
    `resources.record_gpus` gives (`trajectories.gpus` for a task whose code needs a GPU, else 0) for the tasks the
    config can generate: the entrypoints the teacher is offered and, for post-training topics, the base they
    post-train (`post_training.base_model`, else a task spec's default). Should only some of them need one, every job
    is counted as asking (an upper bound)."""
    spec_default = PostTrainingSpec.model_fields["base_model"].default
    base = spec_default if cfg.topics.kind == "post_training" else None
    asks = {e: record_gpus(cfg, _planned_record(e, base)) for e in TEACHER_ENTRYPOINTS}
    gpu_kinds = [e for e, gpus in asks.items() if gpus]
    if cfg.topics.kind == "post_training":
        chosen = (f"post_training.base_model {cfg.post_training.base_model}" if cfg.post_training.base_model else
                  f"each task's own base, assumed the spec's default {spec_default} (post_training.base_model unset)")
        what = f"post-training tasks on {chosen}"
    else:
        what = "research tasks (" + ", ".join(TEACHER_ENTRYPOINTS) + ": no LMSubmissionTasks)"
    if not cfg.trajectories.gpus:
        return 0, "trajectories.gpus = 0"
    if not gpu_kinds:
        return 0, f"CPU tasks: {what}"
    bound = "" if len(gpu_kinds) == len(TEACHER_ENTRYPOINTS) else " (an upper bound: only some tasks may need one)"
    return max(asks.values()), f"GPU tasks: {what}{bound}"


def _trajectories_stage(cfg: GymforgeConfig, c: Constants, verified: float) -> StageEstimate:
    """Shards of concurrent rollouts, each shard job holding `task_gpus` GPUs (trajectories.gpus for a task whose
    code needs a GPU, else none)."""
    tr = cfg.trajectories
    gpus, why = task_gpus(cfg)
    shards_per_task = plan.shard_count(cfg)
    rollouts = verified * tr.per_task
    shards = verified * shards_per_task
    steps = min(c("rollout_steps"), tr.max_steps + 1)
    calls_per_rollout = steps * c("rollout_calls_per_step")
    rollout_wall_s = steps * c("rollout_exec_s_per_step") + calls_per_rollout * c("llm_s_per_call")
    # a task's rollouts run shard by shard: waves of `concurrency` in each shard
    waves = sum(math.ceil(len(plan.shard_rollouts(cfg, k)) / tr.concurrency) for k in range(shards_per_task))
    shard_wall_s = waves / shards_per_task * rollout_wall_s
    st = StageEstimate("trajectories", rollouts, "rollouts")
    st.calls = rollouts * calls_per_rollout
    st.prompt_tokens = st.calls * c("rollout_prompt_per_call")
    st.completion_tokens = st.calls * c("rollout_completion_per_call")
    st.gpu_hours = shards * gpus * shard_wall_s / 3600
    st.cpu_hours = rollouts * c("rollout_cpu_s") / 3600
    st.note = (f"{verified:,.0f} tasks x {tr.per_task} = {rollouts:,.0f} rollouts of ~{steps:.1f} steps, "
               f"{shards:,.0f} shards of {min(tr.shard_size, tr.per_task)} ({tr.concurrency} at once, "
               f"{gpus} GPU each: {why}; ~{shard_wall_s / 3600:.2f} h each)")
    if not gpus:  # the shards still hold their cores for their wall time, on CPU nodes
        st.note += (f"; ~{shards * shard_wall_s / 3600:,.0f} shard job-hours on CPU nodes ({tr.threads} cores each; "
                    "CPU-h counts the sandboxes' CPU time)")
    return st


def _sft_and_training(cfg: GymforgeConfig, c: Constants, rollouts: float) -> tuple[list[StageEstimate], dict]:
    """The kept trajectories, their SFT examples, and training's GPU-hours."""
    kept = rollouts * c("kept_per_rollout")
    max_length = cfg.train.max_length
    unit = resolve_unit(cfg.sft.example_unit, max_length, int(c("kept_tokens_max")))
    if unit == "request":  # one example per reply, each at most max_length tokens
        examples_per_kept = c("replies_per_kept")
        tokens_per_kept = min(c("request_tokens_per_kept"), examples_per_kept * max_length)
    else:
        examples_per_kept, tokens_per_kept = 1.0, min(c("kept_tokens_mean"), max_length)
    examples = kept * examples_per_kept
    tokens_per_example = tokens_per_kept / examples_per_kept
    sft = StageEstimate("sft", kept, "kept")
    sft.note = (f"{kept:,.0f} kept trajectories ({c('kept_per_rollout'):.3f} per rollout) -> {examples:,.0f} "
                f"{unit} examples (sft.example_unit {cfg.sft.example_unit}) of ~{tokens_per_example:,.0f} tokens "
                f"(at most train.max_length {max_length})")

    train = cfg.train
    train_tokens = examples * tokens_per_example * train.epochs
    st = StageEstimate("training", 1, "checkpoint")
    params = params_of(train.student)
    tps = c("train_tokens_per_s_per_gpu")
    if not math.isfinite(tps):
        if params:
            flops_per_token = (8 if train.gradient_checkpointing else 6) * params
            tps = GPU_PEAK_FLOPS * TRAIN_MFU / flops_per_token
            c.used["train_tokens_per_s_per_gpu"]["value"] = tps
            c.used["train_tokens_per_s_per_gpu"]["note"] += f"; {params / 1e9:g}B parameters from the model name"
    if train.gpus and math.isfinite(tps) and tps > 0:
        st.gpu_hours = train_tokens / tps / 3600
        lora = " (LoRA: fewer FLOPs than assumed)" if train.lora.enabled else ""
        st.note = (f"{train.student}: {train.epochs:g} epochs x {examples:,.0f} examples x {tokens_per_example:,.0f} tokens"
                   f" = {train_tokens / 1e6:,.1f}M tokens at {tps:,.0f} tokens/s/GPU -> ~{st.gpu_hours / train.gpus:.1f} h"
                   f" on {train.gpus} GPUs ({train.strategy}){lora}")
    elif train.gpus:
        st.note = f"{train.student}: {train_tokens / 1e6:,.1f}M tokens; GPU-hours unknown (parameter count not in the name)"
    else:
        st.note = f"{train.student}: {train_tokens / 1e6:,.1f}M tokens on CPU (train.gpus = 0: no GPU-hours)"
    return [sft, st], {"kept_trajectories": kept, "sft_examples": examples, "train_tokens": train_tokens,
                       "params": params}


def _micro_stage(cfg: GymforgeConfig, c: Constants, verified: float) -> StageEstimate:
    """The micro-scale variants RL trains on (`rl.tasks_from: micro`): one micro_task job per verified task of the RL
    slots (`rl.tasks`, else every verified one), each holding `task_gpus` GPUs (what `resources.micro` asks for the
    slot's task) while it runs the task's code `micro_exec_steps_per_item` times (no teacher). CPU-h: a
    verification job's CPU time (`verification_cpu_s_per_item`), an upper bound: the same check on less data, without
    the teacher's episode."""
    rl = cfg.rl
    jobs = 0.0 if rl.tasks_from != "micro" else min(len(rl.tasks), verified) if rl.tasks else verified
    st = StageEstimate("micro", jobs, "tasks")
    if rl.tasks_from != "micro":
        st.note = "rl.tasks_from is environments: RL trains on the verified tasks themselves, no micro tasks"
        return st
    gpus, why = task_gpus(cfg)
    job_wall_s = c("micro_exec_steps_per_item") * c("rollout_exec_s_per_step")
    st.gpu_hours = jobs * gpus * job_wall_s / 3600
    st.cpu_hours = jobs * c("verification_cpu_s_per_item") / 3600
    st.note = (f"{jobs:,.0f} micro tasks ({'rl.tasks' if rl.tasks else 'every verified task'}) of ~"
               f"{job_wall_s / 3600:.2f} h, {gpus} GPU each: {why}")
    return st


def _rl_stage(cfg: GymforgeConfig, c: Constants, verified: float, params: float | None
              ) -> tuple[StageEstimate, dict[str, Any] | None, list[str]]:
    """On-policy RL (target rl): iterations x tasks_per_iteration x group_size episodes served by the policy itself
    (no API cost); the update reads every request of every episode three times (sampling policy and reference
    log-probs, then the trained forward/backward, 6 FLOPs per parameter and token per epoch)."""
    rl = cfg.rl
    per_iteration = min(rl.tasks_per_iteration, max(verified, 1)) * rl.group_size
    episodes = rl.iterations * per_iteration
    rl_steps = min(c("rollout_steps"), rl.max_steps + 1)
    rl_calls = rl_steps * c("rollout_calls_per_step")
    episode_wall_s = rl_steps * c("rollout_exec_s_per_step") + rl_calls * c("llm_s_per_call")
    rollout_wall_s = math.ceil(per_iteration / rl.concurrency) * episode_wall_s
    update_tokens = per_iteration * rl_calls * min(c("rollout_prompt_per_call"), rl.max_length)
    st = StageEstimate("rl", episodes, "episodes")
    st.calls = episodes * rl_calls
    st.prompt_tokens = st.calls * c("rollout_prompt_per_call")
    st.completion_tokens = st.calls * min(c("rollout_completion_per_call"), rl.max_new_tokens)
    if params and rl.gpus:
        train_flops = 8 if rl.gradient_checkpointing and rl.gpus > 1 else 6  # recomputed forward: +2
        update_s = update_tokens * (train_flops * rl.epochs + 4) * params / (GPU_PEAK_FLOPS * TRAIN_MFU * rl.gpus)
        st.gpu_hours = rl.iterations * rl.gpus * (rollout_wall_s + update_s) / 3600
        st.note = (f"{rl.iterations} iterations x {per_iteration} episodes of ~{rl_steps:.1f} steps = {episodes:,.0f}"
                   f" episodes; per iteration ~{rollout_wall_s / 60:.0f} min of rollouts + ~{update_s / 60:.0f} min of "
                   f"update on {rl.gpus} GPUs (one job: policy server and trainer share them)")
    else:
        st.cpu_hours = rl.iterations * rollout_wall_s / 3600
        st.note = (f"{rl.iterations} iterations x {per_iteration} episodes = {episodes:,.0f} episodes; "
                   + ("CPU (rl.gpus = 0: no GPU-hours)" if not rl.gpus else
                      "GPU-hours unknown (parameter count not in the student's name)"))
    # the update's memory per GPU (gymforge.rl.memory; train_rl refuses to start a plan that cannot fit)
    warnings: list[str] = []
    rl_memory = None
    memory = rl_update_memory(cfg, params) if rl.gpus else None
    if memory is not None:
        rl_memory = {**memory.as_dict(), "advice": "" if memory.fits else advice(cfg, params)}
        st.note += (f"; update ~{memory.total:.0f} GiB per GPU ({memory.note}; "
                    f"{'fits' if memory.fits else 'DOES NOT FIT'} {memory.capacity:.0f} GiB)")
        if not memory.fits:
            warnings.append(f"rl: the update of {cfg.train.student} needs ~{memory.total:.0f} GiB per GPU with "
                            f"{memory.note}, more than a {memory.capacity:.0f} GiB GPU: train_rl will refuse to "
                            f"start. {rl_memory['advice']}")
    return st, rl_memory, warnings


def _evaluate_stage(cfg: GymforgeConfig, c: Constants, ratio: float) -> tuple[StageEstimate, list[dict[str, Any]]]:
    """models x tasks x runs_per_task; served models hold serving.gpus per (model, task) job; the teacher's runs
    write reasoning tokens as it does elsewhere."""
    ev = cfg.evaluate
    teacher = cfg.llm.teacher
    n_tasks, tasks_from = _eval_tasks(cfg)
    e_steps = min(c("eval_steps_per_run"), ev.max_steps + 1)
    e_calls = e_steps * c("eval_calls_per_step")
    run_wall_s = e_steps * c("eval_exec_s_per_step") + e_calls * c("llm_s_per_call")
    job_wall_s = math.ceil(ev.runs_per_task / ev.concurrency) * run_wall_s
    st = StageEstimate("evaluate", len(ev.models) * n_tasks * ev.runs_per_task, "runs")
    per_model = []
    for spec in ev.models:
        runs = n_tasks * ev.runs_per_task
        calls = runs * e_calls
        prompt, completion = calls * c("eval_prompt_per_call"), calls * c("eval_completion_per_call")
        reasoning = completion * ratio if spec.source == "teacher" else 0.0
        price = teacher.price if spec.source == "teacher" else spec.price
        cost = 0.0 if spec.source in SERVED_SOURCES else price.cost(prompt, completion + reasoning)
        gpu_h = n_tasks * job_wall_s / 3600 * ev.serving.gpus if spec.source in SERVED_SOURCES else 0.0
        st.calls += calls
        st.prompt_tokens += prompt
        st.completion_tokens += completion
        st.reasoning_tokens += reasoning
        st.cost_usd += cost
        st.gpu_hours += gpu_h
        per_model.append({"model": spec.name, "source": spec.source, "runs": runs, "calls": calls,
                          "reasoning_tokens": reasoning, "cost_usd": cost, "gpu_hours": gpu_h})
    st.cpu_hours = st.items * c("eval_cpu_s_per_run") / 3600
    st.note = (f"{len(ev.models)} models x {n_tasks} tasks ({tasks_from}) x {ev.runs_per_task} runs of ~{e_steps:.1f} "
               f"steps; served models hold {ev.serving.gpus} GPU per job (~{job_wall_s / 3600:.2f} h each)")
    return st, per_model


def estimate(cfg: GymforgeConfig, measured: Measured | None = None, *,
             reasoning_ratio: float | None = None) -> dict[str, Any]:
    """The projected plan of `cfg`, as a JSON-able dict (see `render`). `measured`: a pilot run's constants;
    `reasoning_ratio`: hidden reasoning tokens per visible completion token of the teacher, instead of the pilot's
    or the default."""
    c = Constants(measured, cfg.train.student)
    teacher = cfg.llm.teacher
    tr = cfg.trajectories
    reasoning = _reasoning(cfg, c, reasoning_ratio)

    stages, counts = _generation_stages(cfg, c)
    verified = counts["verified_tasks"]
    trajectories = _trajectories_stage(cfg, c, verified)
    stages.append(trajectories)
    for s in stages:  # every call so far goes to the teacher
        s.reasoning_tokens = s.completion_tokens * reasoning["ratio"]
        s.price(teacher.price)
    sft_training, trained = _sft_and_training(cfg, c, trajectories.items)
    stages += sft_training
    rl, rl_memory, warnings = _rl_stage(cfg, c, verified, trained["params"])
    ev, per_model = _evaluate_stage(cfg, c, reasoning["ratio"])
    # served models cost no API money; the evaluation priced each API model itself
    stages += [_micro_stage(cfg, c, verified), rl, ev]

    totals = {k: sum(getattr(s, k) for s in stages) for k in
              ("calls", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost_usd", "gpu_hours", "cpu_hours")}
    return {
        "teacher": {"provider": teacher.provider, "model": tr.model or teacher.model,
                    "price": teacher.price.model_dump()},
        "student": cfg.train.student,
        "budget_usd": cfg.llm.budget_usd,
        "measured_from": str(measured.results) if measured and measured.values else None,
        "constants_source": c.source_summary(),
        "reasoning": reasoning,
        "plan": {"topic_slots": cfg.topics.n, "topic_batches": counts["topic_batches"],
                 "kept_topics": counts["kept_topics"], "verified_tasks": verified, "rollouts": trajectories.items,
                 "shards": verified * plan.shard_count(cfg), "shard_gpus": task_gpus(cfg)[0],
                 "shard_gpus_why": task_gpus(cfg)[1], "kept_trajectories": trained["kept_trajectories"],
                 "sft_examples": trained["sft_examples"], "train_tokens": trained["train_tokens"],
                 "eval_runs": ev.items, "eval_tasks": _eval_tasks(cfg)[0], "rl_episodes": rl.items},
        "stages": [s.__dict__ for s in stages],
        "evaluate_models": per_model,
        "totals": totals,
        "rl_memory": rl_memory,
        "warnings": warnings,
        "constants": c.used,
    }


# ---- loading and rendering ------------------------------------------------------------------------------


def load_configs(configfiles: Iterable[str | Path]) -> GymforgeConfig:
    """As `snakemake --configfile A B` resolves them: the files in order, each over the files its `base:` names;
    with none, ./config.yaml (gymforge.core.config.layered_config)."""
    return validate_config(layered_config(configfiles))


def _fmt(x: float) -> str:
    if x >= 1e9:
        return f"{x / 1e9:.2f}B"
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    return f"{x:,.0f}"


def _source_line(report: dict[str, Any]) -> str:
    src = report["constants_source"]
    rest = ", ".join(f"{name} {n}" for name, n in src["counts"].items())
    return f"constants from {src['primary']} (constants per source: {rest})"


def _reasoning_line(report: dict[str, Any]) -> str:
    r = report["reasoning"]
    if not r["ratio"]:
        return f"reasoning tokens: none priced ({r['source']})"
    why = f"; a reasoning teacher by {r['reasoning_teacher']}" if r["reasoning_teacher"] else ""
    return (f"reasoning tokens: {r['ratio']:.2f} hidden per visible completion token of the teacher, billed as output "
            f"({r['source']}{why})")


def render(report: dict[str, Any], title: str = "") -> str:
    t = report["teacher"]
    p = t["price"]
    lines = [f"gymforge estimate{': ' + title if title else ''}",
             f"teacher {t['model']} ({t['provider']}) at ${p['input_per_mtok']:g} / ${p['output_per_mtok']:g} per M "
             f"input / output tokens; student {report['student']}",
             _source_line(report), _reasoning_line(report), ""]
    head = (f"{'stage':<13} {'items':>9} {'unit':<10} {'LLM calls':>10} {'prompt tok':>11} {'compl tok':>10} "
            f"{'reason tok':>10} {'cost $':>11} {'GPU-h':>9} {'CPU-h':>8}")
    lines += [head, "-" * len(head)]
    for s in report["stages"]:
        lines.append(f"{s['name']:<13} {_fmt(s['items']):>9} {s['unit']:<10} {_fmt(s['calls']):>10} "
                     f"{_fmt(s['prompt_tokens']):>11} {_fmt(s['completion_tokens']):>10} "
                     f"{_fmt(s['reasoning_tokens']):>10} {s['cost_usd']:>11,.2f} "
                     f"{s['gpu_hours']:>9,.1f} {s['cpu_hours']:>8,.1f}")
    tot = report["totals"]
    lines.append("-" * len(head))
    lines.append(f"{'total':<13} {'':>9} {'':<10} {_fmt(tot['calls']):>10} {_fmt(tot['prompt_tokens']):>11} "
                 f"{_fmt(tot['completion_tokens']):>10} {_fmt(tot['reasoning_tokens']):>10} {tot['cost_usd']:>11,.2f} "
                 f"{tot['gpu_hours']:>9,.1f} "
                 f"{tot['cpu_hours']:>8,.1f}")
    lines.append("")
    for s in report["stages"]:
        if s["note"]:
            lines.append(f"  {s['name']:<13} {s['note']}")
    for m in report["evaluate_models"]:
        lines.append(f"  {'':<13} {m['model']} ({m['source']}): {m['runs']:,} runs, ${m['cost_usd']:,.2f}, "
                     f"{m['gpu_hours']:,.1f} GPU-h")
    budget = report["budget_usd"]
    verdict = "fits" if tot["cost_usd"] <= budget else "EXCEEDS it: raise llm.budget_usd or the run stops there"
    lines.append(f"  llm.budget_usd ${budget:,.2f}: the projected ${tot['cost_usd']:,.2f} {verdict}")
    mem = report.get("rl_memory")
    if mem:
        lines.append(f"  rl update memory per GPU ({mem['note']}): states {mem['states']:.1f} + reference "
                     f"{mem['reference']:.1f} + gathered {mem['gathered']:.1f} + activations {mem['activations']:.1f}"
                     f" + logits {mem['logits']:.1f} + overhead {mem['overhead']:.1f} = {mem['total']:.1f} GiB of "
                     f"{mem['capacity']:.0f}: {'fits' if mem['fits'] else 'DOES NOT FIT'}")
    for warning in report.get("warnings", []):
        lines.append(f"  WARNING: {warning}")
    lines.append("")
    lines.append("constants (pilot: measured in the pilot run; mlgym: MLGym's released runs; offline: the offline run "
                 "of config.yaml; paper; datasheet; assumption; option: given on the command line; config: follows from the "
                 "config):")
    for key, u in report["constants"].items():
        value = u["value"]
        shown = "n/a" if not math.isfinite(value) else f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
        lines.append(f"  {key:<33} {shown:>10}  {u['source']:<10} {u['note']}")
    return "\n".join(lines)


def main(args: Any) -> None:
    """`gymforge estimate [--configfile F...] [--results R] [--defaults] [--reasoning-ratio X] [--json]`."""
    cfg = load_configs(args.configfile)
    results = Path(args.results) if args.results else cfg.results
    measured = None
    if not args.defaults and has_data(results):
        measured = measure(results)
    elif args.results and not args.defaults:
        print(f"gymforge estimate: {results} holds no finished run; using the default constants", file=sys.stderr)
    ratio = getattr(args, "reasoning_ratio", None)
    if ratio is not None and (not math.isfinite(ratio) or ratio < 0):
        raise SystemExit(f"gymforge estimate: --reasoning-ratio {ratio}: a number of tokens, at least 0")
    report = estimate(cfg, measured, reasoning_ratio=ratio)
    title = (" + ".join(args.configfile) if args.configfile else
             "config.yaml" if Path("config.yaml").is_file() else "the built-in defaults (no config.yaml here)")
    print(json.dumps(report, indent=2) if args.json else render(report, title))
