"""Rollouts stage: `trajectories.per_task` teacher rollouts per verified task, in shards of concurrent episodes.

Each shard is one Snakemake target, `trajectories/<slot>/shard_<k>.json`, holding the rollouts with
indices `[k * shard_size, (k + 1) * shard_size)` (capped at `per_task`). A task that was not verified
gets trivial `skipped` shards, so the DAG never depends on verification outcomes.

Inside a shard the rollouts run as asyncio tasks (`trajectories.concurrency` at once): LLM calls are
async, sandbox commands run in one thread per episode, and every rollout has its own workspace
(`.shard_<k>.work/r<index>/`). Rollout `i` of slot `s` is seeded with `derive_seed(seed, "rollout", s, i)`,
whatever shard or order it runs in.

Resume: each finished rollout is written atomically to `.shard_<k>.parts/r<index>.json` next to the
shard (not a declared output, so Snakemake leaves it alone when a job dies). A rerun of the shard loads
the parts whose fingerprint (config sections that change a rollout + the verification report) matches
and runs only the missing rollouts; the shard file is assembled in index order, so a killed-and-resumed
shard equals an uninterrupted one. Episodes that ended because the endpoint failed or the budget ran
out (`... (api)`, `... (cost)`) or that crashed are transient: not persisted, retried by the next run
(the job fails after the other rollouts finish, saying so).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gymforge.core import atomic
from gymforge.runtime import nodelocal, resources
from gymforge.core.config import GymforgeConfig
from gymforge.runtime.progress import Progress
from gymforge.core.records import (
    Exit,
    RolloutRecord,
    SandboxRef,
    ShardRecord,
    TeacherRef,
    UsageRecord,
    VerificationReport,
    derive_seed,
    text_hash,
)
from gymforge.core.plan import parts_dir, shard_count, shard_id, shard_ids, shard_rollouts  # noqa: F401  (re-exported)
from gymforge.llm.client import make_client
from gymforge.tasks.episode import EpisodeRunner

log = logging.getLogger("gymforge.rollouts")

# ---- the plan ---------------------------------------------------------------------------------------


def rollout_seed(cfg: GymforgeConfig, slot: str, index: int) -> int:
    return derive_seed(cfg.seed, "rollout", slot, index)


def work_dir(out: Path) -> Path:
    """The shard's episode workspaces: node-local under $TMPDIR when set (`core.nodelocal`)."""
    return nodelocal.workspaces(out, f".{out.stem}.work")


def fingerprint(cfg: GymforgeConfig, report_text: str) -> str:
    return text_hash(cfg.digest("seed", "teacher", "sandbox", "trajectories") + text_hash(report_text))


def _scrub(url: str | None) -> str:
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def rollout_client(cfg: GymforgeConfig) -> Any:
    """The teacher client for rollouts: `llm.teacher` with `trajectories.model` as its model, when set."""
    return make_client(cfg, "trajectories", model=cfg.trajectories.model)


# ---- one shard --------------------------------------------------------------------------------------


def rollout_shard(cfg: GymforgeConfig, slot: str, shard: int, report: Path, env: Path, out: Path,
              *, llm: Any = None) -> ShardRecord:
    """Run (or finish) one shard and write it to `out`; `llm` overrides the teacher client (tests)."""
    out = Path(out)
    report_text = Path(report).read_text()
    report_record = VerificationReport.model_validate_json(report_text)
    indices = shard_rollouts(cfg, shard)
    if report_record.status != "ok":
        record = ShardRecord(item=slot, shard=shard, status="skipped", task_id=report_record.task_id,
                             reason_code=report_record.reason_code or f"environment_{report_record.status}",
                             reason=f"environment {report_record.status}: {report_record.reason or report_record.reason_code}")
        atomic.write_text(out, record.model_dump_json(indent=1))
        shutil.rmtree(parts_dir(out), ignore_errors=True)  # left over from when the task was verified
        shutil.rmtree(work_dir(out), ignore_errors=True)
        return record
    stamp = fingerprint(cfg, report_text)
    parts = parts_dir(out)
    done: dict[int, RolloutRecord] = {}
    for index in indices:
        path = parts / f"r{index:05d}.json"
        if path.exists():
            try:
                part = RolloutRecord.model_validate_json(path.read_text())
            except ValueError:
                continue  # atomic writes make this unlikely; a bad part is simply redone
            if part.fingerprint == stamp:
                done[index] = part
    todo = [i for i in indices if i not in done]
    log.info("%s shard %d: %d rollouts (%s), %d already finished, %d to run", slot, shard, len(indices),
             f"{indices[0]}..{indices[-1]}" if indices else "none", len(done), len(todo))
    record = ShardRecord(item=slot, shard=shard, status="ok", task_id=report_record.task_id, rollout_indices=indices,
                         fingerprint=stamp, resumed=len(done))
    failures: list[str] = []
    if todo:
        runner = _ShardRunner(cfg, slot, report_record, Path(env), out, stamp, llm)
        new, failures, usage = asyncio.run(runner.run(todo))
        done.update(new)
        record.usage = usage
    if failures:
        raise RuntimeError(
            f"{slot} shard {shard}: {len(failures)} rollout(s) did not finish and will be retried by the next run "
            f"({len(done)} finished ones are kept in {parts}):\n" + "\n".join(failures))
    record.rollouts = [done[i] for i in indices]
    atomic.write_text(out, record.model_dump_json())
    shutil.rmtree(parts, ignore_errors=True)
    shutil.rmtree(work_dir(out), ignore_errors=True)
    return record


class _ShardRunner:
    def __init__(self, cfg: GymforgeConfig, slot: str, report: VerificationReport, env_dir: Path, out: Path,
                 stamp: str, llm: Any) -> None:
        self.cfg, self.slot, self.report, self.out, self.stamp = cfg, slot, report, out, stamp
        self.tree = env_dir / "mlgym"
        self.task_yaml = next((self.tree / "configs" / "tasks").glob("*.yaml"))
        # trajectories.gpus only for a task whose code needs a GPU: what rule rollout_shard declared
        self.episodes = EpisodeRunner.for_config(cfg, resources.record_gpus(cfg, report.model_dump()))
        self.sandbox = self.episodes.sandbox
        self.llm = llm
        self.owns_llm = llm is None

    def _teacher(self) -> TeacherRef:
        ep = self.llm.endpoint
        return TeacherRef(provider=ep.provider, model=ep.model, endpoint=_scrub(getattr(self.llm, "base_url", None)),
                          temperature=getattr(ep, "temperature", 0.0), max_tokens=getattr(ep, "max_tokens", 0))

    def _sandbox_ref(self) -> SandboxRef:
        return SandboxRef(backend=self.sandbox.name, confinement=getattr(self.sandbox, "confinement", None),
                          image=self.cfg.sandbox.image if self.sandbox.name == "docker" else None)

    async def run(self, todo: list[int]) -> tuple[dict[int, RolloutRecord], list[str], UsageRecord]:
        if self.llm is None:
            self.llm = rollout_client(self.cfg)
        slots = asyncio.Semaphore(self.cfg.trajectories.concurrency)
        finished: dict[int, RolloutRecord] = {}
        failures: list[str] = []
        progress = Progress(len(todo), f"{self.slot} {self.out.stem} rollouts", log)

        async def one(index: int) -> None:
            async with slots:
                try:
                    rec = await self._rollout(index)
                except Exception as err:  # noqa: BLE001 - reported and retried by the next run
                    log.error("%s rollout %d crashed: %s", self.slot, index, traceback.format_exc())
                    failures.append(f"rollout {index}: crashed: {type(err).__name__}: {err}")
                    progress.advance(detail=f"rollout {index} crashed")
                    return
            status = rec.trajectory.info.exit_status or ""
            if Exit.parse(status).transient:
                failures.append(f"rollout {index}: {status}: {rec.trajectory.info.exit_detail or 'transient failure'}")
                progress.advance(detail=f"rollout {index}: {status} (will be retried)")
                return
            atomic.write_text(parts_dir(self.out) / f"r{index:05d}.json", rec.model_dump_json())
            finished[index] = rec
            progress.advance(detail=f"rollout {index}: {status} after {len(rec.trajectory.trajectory)} steps, "
                                    f"scores {rec.trajectory.info.score[-1:] or 'none'}, {rec.wall_s:.1f}s")

        try:
            await asyncio.gather(*(one(i) for i in todo))
        finally:
            if self.owns_llm:
                await self.llm.aclose()
        usage = UsageRecord()
        if hasattr(self.llm, "usage"):
            usage.add(self.llm.usage)
        return finished, failures, usage

    async def _rollout(self, index: int) -> RolloutRecord:
        seed = rollout_seed(self.cfg, self.slot, index)
        baseline = self.report.baseline_scores[0] if self.report.baseline_scores else None
        interfaces = self.cfg.trajectories.interfaces
        interface = interfaces[index % len(interfaces)] if interfaces else None
        t0 = time.monotonic()
        traj = await self.episodes.run(
            self.llm, self.task_yaml, root=self.tree, run_dir=work_dir(self.out) / f"r{index:05d}",
            max_steps=self.cfg.trajectories.max_steps, seed=seed, baseline=baseline,
            hidden_columns=self.report.hidden_columns, interface=interface,
            meta={"stage": "trajectories", "slot": self.slot, "rollout": index})
        return RolloutRecord(slot=self.slot, task_id=self.report.task_id or traj.meta["task_id"], rollout=index,
                             seed=seed, teacher=self._teacher(), sandbox=self._sandbox_ref(),
                             max_steps=self.cfg.trajectories.max_steps, baseline=baseline, fingerprint=self.stamp,
                             wall_s=round(time.monotonic() - t0, 3), trajectory=traj)
