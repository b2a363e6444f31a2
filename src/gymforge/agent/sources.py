"""Trajectories as SFT candidates, whatever produced them: gymforge's rollout shards, and trajectories gymforge
did not roll out itself (`gymforge import-trajectories`, `sft.extra_sources`).

Three formats, found anywhere under a directory (or given as one file), in sorted path order:

- **MLGym run folders**: `<task>.traj` beside `results.json` (MLGym's `save_trajectory`/`save_results`;
  SWE-agent-style runs have the same `history`). The example is the conversation exactly as the model was
  sent it at its last real reply, rebuilt the way MLGym's agent built it: the history entries of the
  replying agent (`local_history`), MLGym's default history processor `Last5Observations` (the first
  user message, demonstrations and the last 5 user messages in full, older ones replaced by
  `Old output omitted (N lines)`), only `role` and `content` (`history_to_messages`), followed by the
  reply. Forced exits (`exit_context`, `exit_cost`, `exit_format`, ...: MLGym appends an assistant entry
  such as "Exit due to cost limit" that no model wrote) are not replies; the example ends at the last
  reply before them. The `request` unit's examples (`mlgym_reply_chats`) are the same view at every real
  reply. Not recoverable from MLGym's files: a reply that needed a format re-ask was generated after the
  rejected reply and MLGym's format-error prompt, which its history drops.
  The model is the run folder's first `__`-separated field (MLGym names runs
  `<model>__<task>__<config>__...`), the scores are `info.score` (`results.json`'s `agent` when the
  trajectory has none), the priority metric is the first key of `results.json`'s `baseline`.
  MLGym records no audit, so each step's command is audited here from its text (`Auditor.check_command`,
  the workspace `/home/agent/workspace`, the evaluation script `evaluate.py`, MLGym's convention) and the
  step's recorded observation: an `edit`/`insert`/`create` of `evaluate.py` that MLGym's tool refused
  (read-only file, permission denied, edit not applied, usage error) is `eval_edit_rejected`, not
  `eval_tamper`. The workspace scan needs the live workspace and cannot be replayed.
- **gymforge run-task folders**: a `.traj` written by gymforge (`environment: gymforge`): its flags, and
  the examples as the SFT stage builds them (`sft_messages`, `reply_chats`).
- **gymforge rollout shards** (`shard_*.json`): every rollout, exactly as the SFT stage reads them.

Every candidate then goes through the SFT stage's filters (`gymforge.stages.sft.filter_examples`) with the
student's tokenizer; the same reader serves `sft.extra_sources`, which mixes these sources into the
`sft_dataset` rule (whose inputs `extra_source_files` lists at Snakefile parse time: this module stays cheap to
import).
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from gymforge.agent.trajectory import reply_chats, sft_messages
from gymforge.core.metrics import has_valid_metric
from gymforge.core.records import RolloutRecord, ShardRecord, Trajectory

MLGYM_KEEP = 5  # MLGym's default history processor: Last5Observations (configs/agents/default.yaml)
MLGYM_WORKDIR = "/home/agent/workspace"
MLGYM_EVALUATION = ("evaluate.py",)
RESULTS_FILE = "results.json"


class TrajectoryImportError(ValueError):
    """A source that cannot be imported (named in the message)."""


def source_files(root: str | Path) -> list[Path]:
    """The files an import of `root` reads, sorted: `.traj` files, the `results.json` beside them, and
    `shard_*.json` rollout shards (what a Snakemake rule declares as its inputs)."""
    root = Path(root)
    if root.is_file():
        found = [root]
    elif root.is_dir():
        found = [p for p in root.rglob("*") if p.is_file() and (p.suffix == ".traj" or _is_shard_name(p))]
    else:
        raise TrajectoryImportError(f"{root}: no such file or directory")
    out: list[Path] = []
    for p in sorted(found):
        out.append(p)
        if p.suffix == ".traj" and (p.parent / RESULTS_FILE).is_file():
            out.append(p.parent / RESULTS_FILE)
    return list(dict.fromkeys(out))


def extra_source_files(sources: list[str]) -> list[str]:
    """Every file of `sft.extra_sources`: the `sft_dataset` rule's extra inputs (a missing source fails)."""
    try:
        return [str(p) for source in sources for p in source_files(source)]
    except TrajectoryImportError as err:
        raise TrajectoryImportError(f"sft.extra_sources: {err}") from None


def _is_shard_name(path: Path) -> bool:
    return path.name.startswith("shard_") and path.suffix == ".json"


# ---- candidates ----------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One trajectory offered to the filters, whatever it came from (a rollout shard, an imported run)."""

    id: str
    slot: str  # what the per-task cap and `per_task` statistics group by
    task: str
    rollout: int
    seed: int | None
    teacher: str  # the model that wrote the replies
    exit_status: str
    steps: int
    messages: list[dict[str, str]] | None  # the example (None: no assistant turn)
    scores: list[dict[str, Any]]
    flags: list[str]  # audit flag codes, sorted, once each
    metric: str | None  # the priority metric
    source: dict[str, Any] = field(default_factory=dict)  # where it came from (`origin`, `format`, `path`, ...)
    # the `request` unit's examples, built on demand (O(turns^2) messages): each accepted reply after the exact
    # request it answered (`reply_chats`, `mlgym_reply_chats`)
    reply_chats: Callable[[], list[list[dict[str, str]]]] = field(default=lambda: [], repr=False)

    @property
    def successful(self) -> bool:
        return any(has_valid_metric(entry) for entry in self.scores)


def rollout_candidate(rec: RolloutRecord, *, ident: str | None = None, source: dict[str, Any] | None = None) -> Candidate:
    """The candidate of one `RolloutRecord` of a shard."""
    traj = rec.trajectory
    return Candidate(id=ident or f"{rec.slot}-r{rec.rollout:05d}", slot=rec.slot, task=rec.task_id,
                     rollout=rec.rollout, seed=rec.seed, teacher=rec.teacher.model,
                     exit_status=traj.info.exit_status or "unknown", steps=len(traj.trajectory),
                     messages=sft_messages(traj), scores=list(traj.info.score),
                     flags=sorted({f.code for f in traj.info.flags}), metric=_priority(rec),
                     source=source or {"origin": "rollouts", "format": "gymforge-shard"},
                     reply_chats=lambda: reply_chats(traj))


def shard_candidates(shard_files: Iterable[Path]) -> Iterator[Candidate]:
    for _shard, rec in read_shards(shard_files):
        yield rollout_candidate(rec)


def read_shards(shard_files: Iterable[Path]) -> Iterator[tuple[ShardRecord, RolloutRecord]]:
    """(shard, rollout) pairs in (slot, shard, rollout index) order, one shard in memory at a time."""
    for path in sorted(Path(p) for p in shard_files):
        shard = ShardRecord.model_validate_json(path.read_text())
        for rec in sorted(shard.rollouts, key=lambda r: r.rollout):
            yield shard, rec


def _priority(rec: RolloutRecord) -> str | None:
    if rec.baseline:
        return next(iter(rec.baseline))
    scores = rec.trajectory.info.score
    return next(iter(scores[-1]), None) if scores else None


# ---- MLGym ----------------------------------------------------------------------------------------------


def _forced_exit(entry: dict[str, Any]) -> bool:
    """An assistant entry MLGym appended for an exit no model wrote (`exit_cost`, `exit_context`, ...)."""
    return str(entry.get("action") or "").startswith("exit_") and str(entry.get("thought") or "").startswith(
        "Exit due to")


def mlgym_messages(history: list[dict[str, Any]], keep: int = MLGYM_KEEP) -> list[dict[str, str]] | None:
    """What the model was sent at its last real reply, plus that reply (None: it never replied).

    MLGym's `local_history` (entries of the replying agent) through `last_n_history(history, keep)` and
    `history_to_messages` (role and content as strings).
    """
    replies = [i for i, e in enumerate(history) if e.get("role") == "assistant" and not _forced_exit(e)]
    if not replies:
        return None
    agent = history[replies[-1]].get("agent")
    view = [e for e in history[: replies[-1] + 1] if "agent" not in e or e.get("agent") == agent]
    users = sum(1 for e in view if e.get("role") == "user" and not e.get("is_demo"))
    recent = range(users - keep + 1, users + 1)
    messages, user_index = [], 0
    for e in view:
        content = str(e.get("content") or "")
        if e.get("role") == "user" and not e.get("is_demo"):
            user_index += 1
            if user_index != 1 and user_index not in recent:
                content = f"Old output omitted ({len(content.splitlines())} lines)"
        messages.append({"role": str(e.get("role") or ""), "content": content})
    return messages


def mlgym_reply_chats(history: list[dict[str, Any]], keep: int = MLGYM_KEEP) -> list[list[dict[str, str]]]:
    """One chat per real reply: what MLGym sent the model for it (`mlgym_messages` at that reply), plus the reply."""
    replies = [i for i, e in enumerate(history) if e.get("role") == "assistant" and not _forced_exit(e)]
    return [chat for i in replies if (chat := mlgym_messages(history[: i + 1], keep)) is not None]


def mlgym_flags(steps: list[dict[str, Any]]) -> list[str]:
    """Audit flag codes of an MLGym trajectory's commands (text only), sorted, once each."""
    # deferred: the audit costs the Snakefile's parse ~15 ms (rules/sft.smk imports this module to plan)
    from gymforge.agent.audit import Auditor

    auditor = Auditor(Path(MLGYM_WORKDIR), MLGYM_WORKDIR, evaluation_paths=MLGYM_EVALUATION)
    codes: set[str] = set()
    for step in steps:
        try:
            state = json.loads(step.get("state") or "{}")
        except (TypeError, ValueError):
            state = {}
        state = state if isinstance(state, dict) else {}
        action = str(step.get("action") or "").strip()
        if not action:
            continue
        observation = step.get("observation")
        flags = auditor.check_command(action, cwd=str(state.get("working_dir") or MLGYM_WORKDIR),
                                      open_file=state.get("open_file"),
                                      observation=observation if isinstance(observation, str) else None)
        codes |= {f.code for f in flags}
    return sorted(codes)


def mlgym_model(folder: str) -> str:
    """The model of an MLGym run folder (`<model>__<task>__...`); `unknown` for other names."""
    return folder.split("__", 1)[0] if "__" in folder else "unknown"


def _scores(entries: Any) -> list[dict[str, Any]]:
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def mlgym_candidate(path: Path, data: dict[str, Any], *, ident: str, rollout: int, origin: str) -> Candidate:
    results: dict[str, Any] = {}
    if (path.parent / RESULTS_FILE).is_file():
        try:
            results = json.loads((path.parent / RESULTS_FILE).read_text())
        except ValueError:
            results = {}
        results = results if isinstance(results, dict) else {}
    info = data.get("info") or {}
    scores = _scores(info.get("score")) or _scores(results.get("agent"))
    baseline = results.get("baseline")
    metric = next(iter(baseline), None) if isinstance(baseline, dict) and baseline else (
        next(iter(scores[-1]), None) if scores else None)
    history = [e for e in data.get("history") or [] if isinstance(e, dict)]
    steps = [s for s in data.get("trajectory") or [] if isinstance(s, dict)]
    model = mlgym_model(path.parent.name)
    return Candidate(id=ident, slot=path.stem, task=path.stem, rollout=rollout, seed=None, teacher=model,
                     exit_status=str(info.get("exit_status") or "unknown"), steps=len(steps),
                     messages=mlgym_messages(history), scores=scores, flags=mlgym_flags(steps), metric=metric,
                     source={"origin": origin, "format": "mlgym", "path": ident, "model": model,
                             "history_processor": f"Last{MLGYM_KEEP}Observations"},
                     reply_chats=lambda: mlgym_reply_chats(history))


# ---- gymforge ---------------------------------------------------------------------------------------------


def gymforge_traj_candidate(path: Path, data: dict[str, Any], *, ident: str, rollout: int, origin: str) -> Candidate:
    traj = Trajectory.model_validate(data)
    meta = traj.meta
    task = str(meta.get("task_id") or meta.get("task") or path.stem)
    model = str(meta.get("model") or "unknown")
    baseline = None
    if (path.parent / RESULTS_FILE).is_file():
        baseline = json.loads((path.parent / RESULTS_FILE).read_text()).get("baseline")
    scores = list(traj.info.score)
    metric = next(iter(baseline), None) if isinstance(baseline, dict) and baseline else (
        next(iter(scores[-1]), None) if scores else None)
    seed = meta.get("seed")
    return Candidate(id=ident, slot=task, task=task, rollout=rollout, seed=seed if isinstance(seed, int) else None,
                     teacher=model, exit_status=traj.info.exit_status or "unknown", steps=len(traj.trajectory),
                     messages=sft_messages(traj), scores=scores, flags=sorted({f.code for f in traj.info.flags}),
                     metric=metric, source={"origin": origin, "format": "gymforge-traj", "path": ident},
                     reply_chats=lambda: reply_chats(traj))


def _is_gymforge_traj(data: dict[str, Any]) -> bool:
    steps = data.get("trajectory") or []
    return data.get("environment") == "gymforge" or bool(steps) and isinstance(steps[0], dict) and "step" in steps[0]


# ---- the walk ---------------------------------------------------------------------------------------------


def import_candidates(root: Path, *, origin: str | None = None) -> Iterator[Candidate]:
    """Every trajectory under `root` (a directory or one file) as a filter candidate, in sorted path order."""
    root = Path(root)
    origin = origin or str(root)
    base = root.parent if root.is_file() else root
    per_task: Counter[str] = Counter()
    for path in source_files(root):
        rel = path.relative_to(base).as_posix()
        if _is_shard_name(path):
            try:
                shard = ShardRecord.model_validate_json(path.read_text())
            except ValueError as err:
                raise TrajectoryImportError(f"{path}: not a gymforge rollout shard ({str(err).splitlines()[0]})") from None
            for rec in sorted(shard.rollouts, key=lambda r: r.rollout):
                yield rollout_candidate(rec, ident=f"{rel}#r{rec.rollout:05d}",
                                        source={"origin": origin, "format": "gymforge-shard", "path": rel,
                                                "rollout": rec.rollout})
            continue
        if path.suffix != ".traj":
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise TrajectoryImportError(f"{path}: not JSON ({err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("history"), list):
            raise TrajectoryImportError(f"{path}: not a trajectory (no `history` list)")
        ident = posixpath.dirname(rel) or rel
        task = path.stem
        rollout = per_task[task]
        per_task[task] += 1
        if _is_gymforge_traj(data):
            yield gymforge_traj_candidate(path, data, ident=ident, rollout=rollout, origin=origin)
        else:
            yield mlgym_candidate(path, data, ident=ident, rollout=rollout, origin=origin)
