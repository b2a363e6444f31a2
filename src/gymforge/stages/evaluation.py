"""Evaluation stage, runs: `evaluate.runs_per_task` agent runs of one model on one benchmark task.

One Snakemake job per (model, task) writes `scores/runs/<model>/<task>.json` (an `EvalRecord`); the runs
themselves are MLGym run folders `scores/runs/<model>/<task>/<model>__<task>__run<k>/` holding
`<task>.traj` and `results.json`, so `gymforge aup` and MLGym's own tooling read them as they are.

A job opens the model's endpoint once (a served checkpoint starts one server per job) and keeps
`evaluate.concurrency` runs in flight. Finished run folders carry a `run.json` stamp; a rerun of the job
(after a kill, or with a larger `runs_per_task`) reuses every folder whose stamp matches and runs the rest.
Run `k` of model `m` on task `t` is seeded with `derive_seed(seed, "eval", m, t, k)`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gymforge.core import atomic
from gymforge.runtime import nodelocal
from gymforge.core.config import EndpointConfig, GymforgeConfig, ModelSpec, RequestOptions
from gymforge.runtime.job import SCRATCH_ENV
from gymforge.runtime.progress import Progress
from gymforge.core.records import (EvalRecord, Exit, RunSummary, Trajectory, UsageRecord, derive_seed, final_submission,
                                   text_hash)
from gymforge.core.plan import SERVED_SOURCES, model_spec, run_folder, run_ids, teacher_identity  # noqa: F401  (re-exported)
from gymforge.benchmark.decontamination import ContaminationError, describe, proposal_extra, run
from gymforge.benchmark.suite import load_benchmark, recorded_baseline, require_runnable, task_digest
from gymforge.runtime.gpus import device_total, visible_devices
from gymforge.agent.trajectory import reply_counts
from gymforge.llm.client import LLMClient
from gymforge.llm.serving import open_endpoint
from gymforge.tasks.datacache import cache_root
from gymforge.tasks.episode import EpisodeRunner
from gymforge.tasks.harbor import check_harbor_task
from gymforge.tasks.coherence import check_coherence
from gymforge.tasks.probes import measure_baseline, probe_environment

log = logging.getLogger("gymforge.evaluation")


def checkpoint_tag(checkpoint: str | None) -> str:
    """Identifies a checkpoint's contents cheaply (names, sizes and small JSON files), so a retrained
    student gets a new served name and never hits responses cached for the old one."""
    if not checkpoint:
        return ""
    path = Path(checkpoint)
    if not path.exists():
        return text_hash(checkpoint)[:8]  # a hub id
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(path)}:{f.stat().st_size}".encode())
        if f.suffix == ".json" and f.stat().st_size < 1_000_000:
            digest.update(f.read_bytes())
    return digest.hexdigest()[:8]


def served_name(spec: ModelSpec, checkpoint: str | None) -> str:
    return f"{spec.name}-{checkpoint_tag(checkpoint)}" if spec.source in SERVED_SOURCES else spec.name


def fingerprint(cfg: GymforgeConfig, spec: ModelSpec, task_yaml: Path, served: str) -> str:
    # the post-training suite's runs depend on the base model they post-train (post_training.base_model)
    sections = ("seed", "sandbox", "evaluate", *(("post_training",) if cfg.evaluate.benchmark == "posttraining" else ()))
    return text_hash(cfg.digest(*sections) + spec.identity_json() + served
                     + teacher_identity(cfg, spec) + text_hash(task_digest(task_yaml)))


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES (set by `with-gpus` to the job's lease), else the host's."""
    ids = visible_devices()
    return len(ids) if ids is not None else device_total()[0]


def summarize(traj: Trajectory, run: int, seed: int, folder: str, wall_s: float) -> RunSummary:
    _, malformed = reply_counts(traj)
    return RunSummary(
        run=run, seed=seed, folder=folder, exit_status=traj.info.exit_status, scores=traj.info.score,
        replies=traj.info.model_stats.api_calls, malformed=malformed,
        steps=sum(1 for step in traj.trajectory if not step.action.startswith("exit_")),
        valid_submission=final_submission(traj.info.score, traj.info.exit_status) is not None,
        wall_s=round(wall_s, 3))


def _client(cfg: GymforgeConfig, spec: ModelSpec, endpoint: Any) -> Any:
    if spec.source == "teacher":
        teacher = cfg.llm.teacher
        config = teacher.model_copy(update={"model": endpoint.model})
    else:
        serving = cfg.evaluate.serving
        local = spec.source in SERVED_SOURCES
        # an external endpoint is asked as its spec says (a reasoning model's token field, effort, ...)
        options = {} if local else spec.model_dump(include=set(RequestOptions.model_fields))
        config = EndpointConfig(
            provider="local" if local else "openai", base_url=endpoint.base_url, model=endpoint.model,
            api_key_env=spec.api_key_env, temperature=serving.temperature,
            max_tokens=serving.max_new_tokens if local else cfg.llm.teacher.max_tokens,
            concurrency=cfg.evaluate.concurrency, price=spec.price, token_ids=local, **options)
    return LLMClient(config, stage="evaluate", cache_dir=cfg.cache / "llm", ledger_dir=cfg.results / "llm",
                     budget_usd=cfg.llm.budget_usd, base_url=endpoint.base_url)


def evaluate_task(cfg: GymforgeConfig, model: str, task_id: str, runs: list[int], out: Path,
                  *, checkpoint: str | None = None, log_file: Path | None = None) -> EvalRecord:
    """Run (or finish) `runs` of `model` on benchmark task `task_id`; write the record to `out`."""
    out = Path(out)
    spec = model_spec(cfg, model)
    task = next((t for t in load_benchmark(cfg.evaluate) if t.id == task_id), None)
    if task is None:
        raise ValueError(f"task {task_id!r} is not in the {cfg.evaluate.benchmark} benchmark")
    episodes = EpisodeRunner.for_config(cfg, task.gpus)  # a GPU task's devices
    # hub data, GPUs: say what's missing; local data MLGym makes with a helper: made now, in the sandbox
    require_runnable(task, cache_root(cfg), visible_gpus() if task.gpus else 0, sandbox=episodes.sandbox,
                     limits=episodes.limits)
    baseline = recorded_baseline(task)
    served = served_name(spec, checkpoint)
    stamp = fingerprint(cfg, spec, task.task_yaml, served)
    folder_root = out.parent / task_id
    done: dict[int, RunSummary] = {}
    for k in runs:
        stamp_file = folder_root / run_folder(model, task_id, k) / "run.json"
        if stamp_file.exists():
            saved = json.loads(stamp_file.read_text())
            if saved.get("fingerprint") == stamp:
                done[k] = RunSummary.model_validate(saved["summary"])
    todo = [k for k in runs if k not in done]
    log.info("%s on %s: %d runs, %d already finished, %d to run", model, task_id, len(runs), len(done), len(todo))
    record = EvalRecord(item=f"{model}/{task_id}", status="ok", model=model, task_id=task_id, served_as=served,
                        baseline=baseline, fingerprint=stamp, resumed=len(done))
    if todo:
        gpus = cfg.evaluate.serving.gpus if spec.source in SERVED_SOURCES else 0
        with open_endpoint(cfg, spec, checkpoint=checkpoint, served_name=served, log=log_file) as endpoint:
            llm = _client(cfg, spec, endpoint)
            log.info("%s served as %s at %s (gpus=%d)", model, endpoint.model, endpoint.base_url, gpus)
            new, failures = asyncio.run(_run_all(cfg, episodes, llm, spec, task, todo, baseline, folder_root, stamp))
            record.usage = UsageRecord()
            record.usage.add(llm.usage)
        done.update(new)
        if failures:
            raise RuntimeError(f"{model} on {task_id}: {len(failures)} run(s) did not finish and will be retried "
                               f"by the next run:\n" + "\n".join(failures))
    record.runs = [done[k] for k in runs]
    atomic.write_text(out, record.model_dump_json(indent=1))
    return record


async def _run_all(cfg: GymforgeConfig, episodes: Any, llm: Any, spec: ModelSpec, task: Any, todo: list[int],
                   baseline: dict[str, float] | None, folder_root: Path, stamp: str
                   ) -> tuple[dict[int, RunSummary], list[str]]:
    slots = asyncio.Semaphore(cfg.evaluate.concurrency)
    finished: dict[int, RunSummary] = {}
    failures: list[str] = []
    progress = Progress(len(todo), f"{spec.name} on {task.id} runs", log)

    async def one(k: int) -> None:
        seed = derive_seed(cfg.seed, "eval", spec.name, task.id, k)
        name = run_folder(spec.name, task.id, k)
        folder = folder_root / name
        shutil.rmtree(folder, ignore_errors=True)  # a stale or interrupted attempt
        t0 = time.monotonic()
        async with slots:
            try:
                traj = await episodes.run(llm, task.task_yaml, root=task.root,
                                          run_dir=nodelocal.workspaces(folder, f".work-{k}"),  # $TMPDIR when set
                                          max_steps=cfg.evaluate.max_steps, seed=seed, baseline=baseline,
                                          out_dir=folder, meta={"stage": "evaluate", "model": spec.name, "run": k})
            except Exception as err:  # noqa: BLE001 - reported, and retried by the next run of the job
                log.exception("%s run %d crashed", task.id, k)
                failures.append(f"run {k}: crashed: {type(err).__name__}: {err}")
                progress.advance(detail=f"run {k} crashed")
                return
        status = traj.info.exit_status or ""
        if Exit.parse(status).transient:
            failures.append(f"run {k}: {status}: {traj.info.exit_detail or 'endpoint or budget failure'}")
            progress.advance(detail=f"run {k}: {status} (will be retried)")
            return
        summary = summarize(traj, k, seed, f"{task.id}/{name}", time.monotonic() - t0)
        atomic.write_json(folder / "run.json", {"fingerprint": stamp, "summary": summary.model_dump(mode="json")})
        finished[k] = summary
        progress.advance(detail=f"run {k}: {status} after {summary.steps} steps, "
                                f"{summary.replies - summary.malformed}/{summary.replies} replies well-formed, "
                                f"scores {summary.scores[-1:] or 'none'}")

    try:
        await asyncio.gather(*(one(k) for k in todo))
    finally:
        await llm.aclose()
    return finished, failures


# ---- the steps (rules decontamination and eval_runs) ---------------------------------------------------


def decontamination(cfg: GymforgeConfig, synthesized: list[Path], proposals: list[Path], out: Path) -> str:
    """Check that no synthesized task shares a dataset or family with the benchmark; write the report."""
    by_slot = {Path(p).stem: Path(p) for p in proposals}
    trees, extra = [], {}
    for env in map(Path, synthesized):  # results/environments/<slot>/verified
        if (env / "mlgym").is_dir():
            trees.append(env / "mlgym")
            if env.parent.name in by_slot:
                extra[str(env / "mlgym")] = proposal_extra(by_slot[env.parent.name])
    try:
        # a tree is results/environments/<slot>/verified/mlgym: its item is the slot
        report = run(cfg.evaluate, trees, Path(out), extra, on_overlap=cfg.decontamination.on_overlap,
                     item_of=lambda tree: Path(tree).parent.parent.name)
    except ContaminationError as err:
        raise SystemExit(f"gymforge: scores on the {cfg.evaluate.benchmark} benchmark would be contaminated:\n{err}"
                         ) from err
    return describe(report)


def eval_runs(cfg: GymforgeConfig, model: str, task: str, runs: list[int], out: Path, checkpoint: str | None = None,
              log: Path | None = None) -> str:
    """Run (or finish) `runs` of `model` on benchmark task `task` (one job per model and task)."""
    record = evaluate_task(cfg, model, task, runs, Path(out), checkpoint=checkpoint, log_file=log)
    valid = sum(run.valid_submission for run in record.runs)
    return f"{model} on {task}: {valid}/{len(record.runs)} runs with a valid submission"


def check_benchmark_task(cfg: GymforgeConfig, task: str, out: Path) -> str:
    """Probe benchmark task `task`'s evaluator (`gymforge check-task`) once, after the rules of its coherence check;
    the report lands in `out` whatever it finds: a gameable or incoherent benchmark task is reported beside its
    scores, not failed."""
    found = next((t for t in load_benchmark(cfg.evaluate) if t.id == task), None)
    if found is None:
        raise ValueError(f"task {task!r} is not in the {cfg.evaluate.benchmark} benchmark")
    episodes = EpisodeRunner.for_config(cfg, found.gpus)
    require_runnable(found, cache_root(cfg), visible_gpus() if found.gpus else 0, sandbox=episodes.sandbox,
                     limits=episodes.limits)
    out = Path(out)
    # In the job's scratch directory, which a rerun empties: a killed check leaves nothing beside the reports.
    where = Path(os.environ.get(SCRATCH_ENV) or out.parent)
    with tempfile.TemporaryDirectory(dir=where, prefix=f".{task}-check-") as scratch:
        if found.benchmark == "harbor":  # its folder's checks (gymforge check-task FOLDER)
            report = check_harbor_task(found.root, Path(scratch) / "run", sandbox=episodes.sandbox,
                                       limits=episodes.limits)
            atomic.write_text(out, report.model_dump_json(indent=1))
            failed = report.harbor.failures if report.harbor else []
            return (f"{task}: Harbor task folder, " + ("; ".join(failed) if failed else "every check passed")
                    + f" ({report.seconds:.1f} s)")
        env = episodes.environment(found.task_yaml, root=found.root, run_dir=Path(scratch) / "run")
        env.install()
        baseline = measure_baseline(env)
        # The task's text against what it does, by the rules only (no teacher call in a benchmark job); before the
        # probes, which need the baseline's artefact in place.
        coherence = check_coherence(env, baseline[0] if baseline[1] == "measured" else {}, metric=found.metric,
                                    higher_is_better=found.higher_is_better)
        report = probe_environment(env, seed=derive_seed(cfg.seed, "probes", task), metric=found.metric,
                                   higher_is_better=found.higher_is_better, baseline=baseline)
        report.coherence = coherence
    atomic.write_text(out, report.model_dump_json(indent=1))
    gameable = [p.name for p in report.probes if p.gameable]
    said = "" if coherence.coherent else f"; its text contradicts it: {', '.join(f.kind for f in coherence.findings)}"
    return (f"{task}: GAMEABLE by {', '.join(gameable)}" if gameable else
            f"{task}: {len(report.probes)} probes, none better than the baseline") + said + f" ({report.seconds:.1f} s)"
