"""What each job asks of its scheduler: GPUs, memory, minutes and cores, from the config and, for the jobs of one topic
slot, from whether verification kept that slot.

The rules' `resources:` call these. Snakemake evaluates a resource callable that takes the job's input again just
before the job starts, when that input exists: a rollout shard or micro task of a slot that verification did not keep
(it only writes a "skipped" record) then asks for no GPU and a minutes-sized allocation instead of the verified task's.
The GPU request of a slot's jobs (verification, micro variant, rollout shards) follows the task's code: only a task
whose code needs a GPU (`needs_gpu`) gets `trajectories.gpus`; the others ask for none, since those jobs
otherwise spend their life waiting on the teacher's API. While planning (`snakemake -n` before the slot's records
exist) a slot's jobs show what a verified GPU task would get.

`check_partitions` holds every job's request against the cluster's partitions (the SLURM plugin's partition file),
so that a plan SLURM would reject fails before anything is submitted, naming the config key to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from gymforge.core.plan import shard_mem_mb

if TYPE_CHECKING:
    from gymforge.core.config import GymforgeConfig

JOB_OVERHEAD_MB = 1024  # the job's own process beside its sandbox: gymforge, the agent loop, the LLM client


@dataclass(frozen=True)
class Request:
    """One job's request: `gpu` devices, `mem_mb`, `runtime` minutes, `threads` cores; `key` and `mem_key` the config
    keys that set its runtime and its memory (named by the partition check)."""

    gpu: int
    mem_mb: int
    runtime: int
    threads: int = 1
    key: str = ""
    mem_key: str = ""


# A job that only writes a "skipped" record for a slot verification did not keep.
SKIPPED = Request(gpu=0, mem_mb=JOB_OVERHEAD_MB, runtime=10, threads=1, key="(a skipped slot's job)")


def slot_was_verified(report: str | Path) -> bool:
    """Whether the slot's verification report keeps it; True while the report does not exist yet (planning)."""
    try:
        return json.loads(Path(report).read_text()).get("status") == "ok"
    except FileNotFoundError:
        return True


# What makes a task's code need a GPU: an LMSubmissionTasks task trains and is evaluated under torchrun on CUDA
# (gymforge.tasks.workspace refuses to run one without GPUs), and a post-training task fine-tunes its base model, on CPU
# only for the small base built offline. Every other task (CSV, model and Python submissions) runs on CPU.
GPU_ENTRYPOINTS = frozenset({"LMSubmissionTasks"})
CPU_BASE_MODELS = frozenset({"smollm2-135m"})  # gymforge.student.smollm2.NAME
SPEC_FILE = "post_training.yaml"  # gymforge.tasks.posttraining.SPEC_FILE: what makes a task a post-training task


def needs_gpu(cfg: GymforgeConfig, entrypoint: str | None, post_training_base: str | None = None) -> bool:
    """Whether a task's code needs a GPU: an LMSubmissionTasks task, or a post-training task (`post_training_base`:
    the base its post_training.yaml names; None for a task of another kind) whose base, `post_training.base_model`
    when set, is not the CPU build."""
    if entrypoint in GPU_ENTRYPOINTS:
        return True
    return post_training_base is not None and (cfg.post_training.base_model or post_training_base) not in CPU_BASE_MODELS


def spec_base(text: str) -> str:
    """The base model a post_training.yaml names (the CPU build when it names none or cannot be read)."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError:
        spec = None
    base = spec.get("base_model") if isinstance(spec, dict) else None
    return base if isinstance(base, str) else next(iter(CPU_BASE_MODELS))


def task_gpus(cfg: GymforgeConfig, record: str | Path | None = None) -> int:
    """GPUs a job that runs the slot's task asks for: `trajectories.gpus` when the task's code needs a GPU
    (`needs_gpu`), else 0. Read from a record of the slot: its verification report (`needs_gpu`, else its entrypoint)
    or its starter-code record (tasks/<slot>/status.json: the entrypoint and the generated files). A record of a slot
    that failed asks for none; before the record exists (planning), or when it cannot tell, the task counts as
    needing them."""
    if record is None:
        return cfg.trajectories.gpus
    try:
        data = json.loads(Path(record).read_text())
    except FileNotFoundError:
        return cfg.trajectories.gpus
    return record_gpus(cfg, data)


def record_gpus(cfg: GymforgeConfig, data: dict[str, Any]) -> int:
    """`task_gpus` of a record already read (the dump of a verification report or a starter-code record)."""
    gpus = cfg.trajectories.gpus
    if data.get("status") != "ok":
        return 0
    if data.get("needs_gpu") is not None:
        return gpus if data["needs_gpu"] else 0
    if data.get("entrypoint") is None:
        return gpus
    files = data.get("files") or {}
    base = next((spec_base(text) for path, text in files.items() if PurePosixPath(path).name == SPEC_FILE), None)
    return gpus if needs_gpu(cfg, data["entrypoint"], base) else 0


def _sandbox_job_mb(cfg: GymforgeConfig, explicit: int | None) -> int:
    return explicit if explicit is not None else cfg.sandbox.memory_mb + JOB_OVERHEAD_MB


def verification(cfg: GymforgeConfig, code: str | Path | None = None) -> Request:
    """The verification of the slot whose starter-code record is `code` (its task's GPUs: `task_gpus`)."""
    return Request(task_gpus(cfg, code), _sandbox_job_mb(cfg, cfg.verification.mem_mb),
                   cfg.verification.runtime_min, 1, "verification.runtime_min", "sandbox.memory_mb or verification.mem_mb")


def shard(cfg: GymforgeConfig, report: str | Path | None = None) -> Request:
    """A rollout shard of the slot whose verification report is `report`."""
    if report is not None and not slot_was_verified(report):
        return SKIPPED
    t = cfg.trajectories
    return Request(task_gpus(cfg, report), shard_mem_mb(cfg), t.runtime_min, t.threads, "trajectories.runtime_min",
                   "trajectories.concurrency or sandbox.memory_mb")


def micro(cfg: GymforgeConfig, report: str | Path | None = None) -> Request:
    """The micro variant of the slot whose verification report is `report` (its check runs the task like
    verification, with the GPUs the task's rollouts get)."""
    if report is not None and not slot_was_verified(report):
        return SKIPPED
    return Request(task_gpus(cfg, report), _sandbox_job_mb(cfg, cfg.micro.mem_mb), cfg.micro.runtime_min, 1,
                   "micro.runtime_min", "sandbox.memory_mb or micro.mem_mb")


def evaluation(cfg: GymforgeConfig, gpu: int = 0) -> Request:
    """An eval_runs job (`gpu`: its served model's and its task's GPUs). Its `evaluate.concurrency` runs are in flight
    at once, each in a sandbox of `sandbox.memory_mb`: it asks for `evaluate.mem_mb` (the job with its model server),
    raised to those sandboxes plus the job when that is more, so that SLURM's allocation never kills the job before
    one sandbox reaches its own limit."""
    e = cfg.evaluate
    return Request(gpu, max(e.mem_mb, e.concurrency * cfg.sandbox.memory_mb + JOB_OVERHEAD_MB), e.runtime_min,
                   e.threads, "evaluate.runtime_min", "evaluate.mem_mb, evaluate.concurrency or sandbox.memory_mb")


def benchmark_check(cfg: GymforgeConfig, gpu: int = 0) -> Request:
    """A check_benchmark_task job: the task's evaluator probed one sandbox at a time (`evaluation`'s memory rule for
    one sandbox)."""
    e = cfg.evaluate
    return Request(gpu, max(e.mem_mb, cfg.sandbox.memory_mb + JOB_OVERHEAD_MB), e.runtime_min, 1,
                   "evaluate.runtime_min", "evaluate.mem_mb or sandbox.memory_mb")


# ---- the cluster's partitions ---------------------------------------------------------------------------------


def load_partitions(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """The partitions of a snakemake-executor-plugin-slurm partition file (`partitions: {name: {max_runtime,
    max_gpu, ...}}`); {} without one."""
    if not path:
        return {}
    return dict((yaml.safe_load(Path(path).read_text()) or {}).get("partitions") or {})


def _offers_gpus(limits: dict[str, Any], request: Request) -> bool:
    return not request.gpu or limits.get("max_gpu") is None or limits["max_gpu"] >= request.gpu


def _holds_memory(limits: dict[str, Any], request: Request) -> bool:
    return limits.get("max_mem_mb") is None or limits["max_mem_mb"] >= request.mem_mb


def _fits(limits: dict[str, Any], request: Request) -> bool:
    return (_offers_gpus(limits, request) and _holds_memory(limits, request)
            and (limits.get("max_runtime") is None or limits["max_runtime"] >= request.runtime))


def check_partitions(requests: dict[str, Request], partitions: dict[str, dict[str, Any]], source: str = "") -> None:
    """ValueError naming each rule whose request no partition can take (a GPU job needs a partition with that many
    GPUs per node, enough memory per node (`max_mem_mb`) and a long enough time limit; a limit not listed is
    unlimited), with the key to change."""
    if not partitions:
        return
    problems = []
    for rule, request in requests.items():
        if any(_fits(limits, request) for limits in partitions.values()):
            continue
        kind = [lim for lim in partitions.values() if (lim.get("max_gpu") or 0) >= request.gpu]
        roomy = [lim for lim in kind if _holds_memory(lim, request)]
        longest = max((lim.get("max_runtime", 0) for lim in roomy), default=0)
        largest = max((lim.get("max_mem_mb", 0) for lim in kind), default=0)
        what = f"{request.gpu} GPU(s) for {request.runtime} min" if request.gpu else f"{request.runtime} min"
        if not kind:
            why = f"no partition has {request.gpu} GPUs per node"
        elif not roomy:
            what += f" with {request.mem_mb} MB"
            why = f"the largest partition that offers that allows {largest} MB: lower {request.mem_key or 'its mem_mb'}"
        else:
            why = f"the longest partition that offers that allows {longest} min: lower {request.key}"
        problems.append(f"  {rule}: asks for {what}, but {why}")
    if problems:
        raise ValueError(f"jobs that no partition{f' in {source}' if source else ''} can take:\n" + "\n".join(problems)
                         + "\n(a train_student or train_rl job stopped at its limit resumes from its last checkpoint "
                         "when resubmitted: the profile's `retries`)")


def plan_requests(cfg: GymforgeConfig) -> dict[str, Request]:
    """The request of every rule that runs long, as the plan declares it: for slot jobs a verified task's, both as a
    task whose code needs a GPU and as one whose code does not (its GPU request follows the task; a CPU task's job
    must fit a partition too, with the same memory and minutes)."""
    t, e = cfg.train, cfg.evaluate
    slot_jobs = {"verify_environment": verification(cfg), "micro_task": micro(cfg), "rollout_shard": shard(cfg)}
    requests = dict(slot_jobs)
    if cfg.trajectories.gpus:
        requests.update({f"{rule} (a CPU task)": replace(request, gpu=0) for rule, request in slot_jobs.items()})
    return {
        **requests,
        "train_student": Request(t.gpus, t.mem_mb, t.runtime_min, t.threads, "train.runtime_min", "train.mem_mb"),
        "train_rl": Request(cfg.rl.gpus, cfg.rl.mem_mb, cfg.rl.runtime_min, cfg.rl.threads, "rl.runtime_min",
                            "rl.mem_mb"),
        "eval_runs": evaluation(cfg, e.serving.gpus),
        "fetch_dataset": Request(0, cfg.datasets.mem_mb, cfg.datasets.runtime_min, 1, "datasets.runtime_min",
                                 "datasets.mem_mb"),
    }
