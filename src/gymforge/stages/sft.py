"""SFT data stage: filter the rollouts and turn the kept ones into an SFT dataset (chat format), with statistics.

The filters (below) decide per trajectory; each kept trajectory then becomes examples of one unit
(`sft.example_unit`, docs/training.md "Example units"):

- `conversation`: one example per kept trajectory, its messages exactly what the teacher was sent at its
  final turn followed by its final reply: `build_messages(history up to the last assistant turn)`, the same
  templates and the same history processing (all but the last `AgentConfig.keep_observations` observations
  elided) as the agent loop uses at evaluation time. Its last assistant turn is an exact request/response
  pair of the endpoint log; every earlier assistant turn is the teacher's real reply, but was generated while
  up to `keep_observations` more recent observations were still shown in full (and a reply that needed a
  format re-ask after the rejected reply and the format-error prompt, which the history drops, as MLGym
  does). Every assistant turn is trained; training keeps the first `train.max_length` tokens, so the later
  replies of a longer trajectory are lost.
- `request`: one example per accepted teacher reply, the exact request the loop sent for it (`requests_of`,
  shared with RL: elided observations and the format re-ask included) followed by that reply; only that
  final assistant turn is trained (`Example.unit`, `gymforge.student.masks`: `last_only`). O(turns^2) tokens
  in the examples, though building them tokenizes each distinct turn of a trajectory once
  (`gymforge.student.turn_cache`, the same ids and masks as each request tokenized whole); an example longer than `train.max_length` loses the start of its request, never the reply (unless the
  reply alone is longer), as an RL sample does.
- `auto` (the default): `request` when `train.max_length` is shorter than the longest kept trajectory (in
  student tokens), else `conversation`: with a context that holds every kept trajectory nothing is cut and
  the conversation is the cheaper unit.

`sft/stats.json` records the resolved unit (`example_unit`) and counts, per unit, the examples, the tokens
one epoch feeds, the trained tokens and the replies trained whole (`units`): both units under `auto` and
`request`, so the cost of either choice is visible; only `conversation` when it is asked for (counting the
requests renders every request and writes nothing). `gymforge.agent.trajectory` builds the examples (`sft_messages`, `reply_chats`) and
rebuilds every request a trajectory sent (`requests_of`, which the tests compare with the endpoint's log);
`gymforge.agent.sources` reads the candidates.

Filters, in order (`FILTERS`, applied by `reject_reason`); a rejected trajectory is counted under the first it
fails:
0. `benchmark_overlap`: its task shares a dataset or task family with the benchmark, and decontamination dropped
   it (`decontamination.on_overlap: drop`; the rule's `--decontamination` report);
1. `flagged`: a suspicious-action flag (gymforge.agent.audit: answers or evaluation paths touched, a
   symlink out of the workspace, /proc of another process, a stdlib-named module written), when
   `filter.exclude_flagged` (the default); every flag is counted in `stats["audit"]` either way. A
   trajectory whose only flags are `eval_edit_rejected` (an edit of an evaluation script that changed
   nothing) is kept while `filter.keep_eval_edit_rejected` (the default);
2. `no_successful_submission`: no score entry with a valid (finite, numeric) metric, from `validate`,
   `submit` or an auto-submission alike (docs/training.md, Filters);
3. `no_assistant_turn`: nothing to learn from (every reply was malformed);
4. `too_long`: more than `filter.max_tokens` tokens in the student's tokenizer, chat template applied
   (exactly `max_tokens` is kept);
5. `duplicate`: the same messages as an earlier kept trajectory (exact match);
6. `over_task_cap`: beyond `filter.max_per_task` kept trajectories of the task (first in rollout order).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import statistics
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pydantic import BaseModel, Field

from gymforge.agent.audit import ATTEMPT_CODES
from gymforge.agent.sources import Candidate, import_candidates, shard_candidates
from gymforge.agent.trajectory import KEEP_OBSERVATIONS
from gymforge.benchmark.decontamination import dropped_items
from gymforge.core import atomic
from gymforge.core.config import FilterConfig, GymforgeConfig
from gymforge.core.metrics import has_valid_metric, last_score
from gymforge.core.records import Example, Trajectory
from gymforge.hub.data import quiet_datasets
from gymforge.student.fetch import prefetched, require_offline_copy
from gymforge.student.masks import tokenize_turns
from gymforge.student.tokenizer import build_tokenizer, chat_token_ids, load_tokenizer
from gymforge.student.turn_cache import TurnCache

SUCCESS_RULE = "at least one score entry (validate, submit or auto-submission) with a finite numeric metric"
UNITS = ("conversation", "request")
UNIT_RULES = {
    "conversation": f"one per kept trajectory: the final request as sent (build_messages, keep={KEEP_OBSERVATIONS} "
                    "observations) plus the final reply; every assistant turn trained, cut at train.max_length "
                    "keeping the start",
    "request": f"one per accepted teacher reply: the exact request the loop sent for it (requests_of, keep="
               f"{KEEP_OBSERVATIONS} observations, format re-asks included) plus the reply; only the reply trained, "
               "an example longer than train.max_length loses the start of its request",
}


# ---- per trajectory ---------------------------------------------------------------------------------


def excluding_flags(flags: Iterable[str], cfg: FilterConfig) -> list[str]:
    """The flag codes that drop a trajectory under `filter.exclude_flagged`: all of them, but
    `eval_edit_rejected` while `filter.keep_eval_edit_rejected`."""
    kept = ATTEMPT_CODES if cfg.keep_eval_edit_rejected else frozenset()
    return [f for f in flags if f not in kept]


def is_successful(traj: Trajectory) -> bool:
    """At least one successful submission: a score entry with a valid metric."""
    return any(has_valid_metric(entry) for entry in traj.info.score)


def messages_hash(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


# ---- the filters ----------------------------------------------------------------------------------


@dataclass
class Kept:
    """What the filters kept so far, which the `duplicate` and `over_task_cap` filters compare against."""

    digests: set[str] = field(default_factory=set)  # `messages_hash` of every kept trajectory
    per_slot: Counter[str] = field(default_factory=Counter)  # kept trajectories per slot
    excluded: frozenset[str] = frozenset()  # slots no trajectory may come from (decontamination's drops)

    def add(self, c: Candidate) -> None:
        self.digests.add(messages_hash(c.messages or []))
        self.per_slot[c.slot] += 1


# The filters, in order (module docstring): a reason and whether it rejects the candidate, given its student tokens
# (None: no messages), what was kept before it and the `filter` section. A new filter is one more line here.
FILTERS: tuple[tuple[str, Callable[[Candidate, int | None, Kept, FilterConfig], bool]], ...] = (
    ("benchmark_overlap", lambda c, tokens, kept, f: c.slot in kept.excluded),
    ("flagged", lambda c, tokens, kept, f: f.exclude_flagged and bool(excluding_flags(c.flags, f))),
    ("no_successful_submission", lambda c, tokens, kept, f: not c.successful),
    ("no_assistant_turn", lambda c, tokens, kept, f: c.messages is None),
    ("too_long", lambda c, tokens, kept, f: tokens is not None and tokens > f.max_tokens),
    ("duplicate", lambda c, tokens, kept, f: messages_hash(c.messages or []) in kept.digests),
    ("over_task_cap", lambda c, tokens, kept, f: f.max_per_task is not None and kept.per_slot[c.slot] >= f.max_per_task),
)
REASONS = tuple(reason for reason, _rejects in FILTERS)


def reject_reason(c: Candidate, tokens: int | None, kept: Kept, cfg: FilterConfig) -> str | None:
    """The first filter that rejects `c` (its reason), None when it is kept; `kept` is read, never changed."""
    return next((reason for reason, rejects in FILTERS if rejects(c, tokens, kept, cfg)), None)


class FilterStats:
    """The counts of the filtered candidates that `sft/stats.json` reports: per reason, task (slot), source, exit
    status and teacher, the audit's flags, and the lengths of all and of the kept trajectories."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.sources: dict[str, dict[str, Any]] = {}
        self.exits: dict[str, Counter[str]] = defaultdict(Counter)
        self.teachers: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.flag_codes: Counter[str] = Counter()  # rollouts per flag code
        self.flagged: list[str] = []  # ids of flagged rollouts
        self.tokens_all: list[int] = []
        self.tokens_kept: list[int] = []
        self.turns_all: list[int] = []
        self.turns_kept: list[int] = []

    def add(self, c: Candidate, origin: str, tokens: int | None, turns: int, reason: str | None) -> None:
        """One candidate, its student tokens and assistant turns, and the filters' verdict (None: kept)."""
        task = self.tasks.setdefault(c.slot, {"task_id": c.task, "rollouts": 0, "kept": 0, "discarded": Counter()})
        src = self.sources.setdefault(origin, {"rollouts": 0, "kept": 0, "discarded": Counter()})
        self.teachers[c.teacher] += 1
        self.flag_codes.update(c.flags)
        if c.flags:
            self.flagged.append(c.id)
        self.exits[c.exit_status]["total"] += 1
        if c.messages:
            self.tokens_all.append(tokens or 0)
            self.turns_all.append(turns)
        for group in (task, src):
            group["rollouts"] += 1
            if reason is None:
                group["kept"] += 1
            else:
                group["discarded"][reason] += 1
        if reason is None:
            self.exits[c.exit_status]["kept"] += 1
            self.tokens_kept.append(tokens or 0)
            self.turns_kept.append(turns)
        else:
            self.reasons[reason] += 1

    @property
    def longest_kept(self) -> int | None:
        return max(self.tokens_kept, default=None)


def resolve_unit(configured: str, max_length: int, longest_kept: int | None) -> str:
    """The example unit `sft.example_unit` stands for: `auto` is `request` when the student's context
    (`train.max_length`) is shorter than the longest kept trajectory, else `conversation`."""
    if configured != "auto":
        return configured
    return "request" if longest_kept is not None and longest_kept > max_length else "conversation"


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The `[start, end)` runs of ones of a mask: one per trained assistant turn (found by `re` over its bytes: a
    request's mask is long and holds one run)."""
    return [m.span() for m in re.finditer(rb"[^\x00]+", bytes(mask))]


class UnitCounter:
    """What one example unit gives training (`stats["units"][unit]`), counted with the masks training uses."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self.counts = Counter({"examples": 0, "tokens": 0, "trained_tokens": 0, "replies": 0, "replies_trained": 0,
                               "truncated": 0})

    def add(self, ids: list[int], mask: list[int], *, keep_end: bool) -> None:
        """One example: `keep_end` (request) keeps its last `max_length` tokens, else its first (conversation)."""
        n, cut = len(ids), self.max_length
        window = (max(0, n - cut), n) if keep_end else (0, min(n, cut))
        c = self.counts
        c["examples"] += 1
        c["tokens"] += window[1] - window[0]
        c["trained_tokens"] += sum(mask[window[0]: window[1]])
        c["truncated"] += n > cut
        for start, end in _runs(mask):
            c["replies"] += 1
            c["replies_trained"] += window[0] <= start and end <= window[1]

    def summary(self) -> dict[str, int]:
        return dict(self.counts)


class RolloutSummary(BaseModel):
    """One line of `rollouts.jsonl`: every rollout, kept or not, and why."""

    id: str
    slot: str
    task: str
    rollout: int
    seed: int | None
    exit_status: str
    steps: int
    turns: int
    tokens: int | None
    successful: bool
    kept: bool
    reason: str | None = None
    score: float | None = None
    flags: list[str] = Field(default_factory=list, description="Codes of the audit's flags, sorted, once each.")
    source: str = Field("rollouts", description="`rollouts`, or the extra source / import directory it came from.")


def _features() -> Any:
    from datasets import Features, Value

    string = Value("string")
    return Features({
        "id": string, "messages": [{"role": string, "content": string}], "slot": string, "task": string,
        "rollout": Value("int32"), "seed": Value("int64"), "teacher": string, "exit_status": string,
        "metric": string, "score": Value("float64"), "scores": string, "tokens": Value("int32"),
        "turns": Value("int32"), "source": string, "unit": string, "reply": Value("int32"),
    })


# ---- the whole stage --------------------------------------------------------------------------------


def config_hash(cfg: GymforgeConfig) -> str:
    """Hash of every setting that shapes the SFT data (the dataset card's provenance stamp)."""
    return cfg.digest("seed", "teacher", "datasets", "proposals", "generation", "sandbox", "verification",
                      "trajectories", "filter", "student", "sft")


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "min": ordered[0], "median": statistics.median(ordered),
            "mean": round(statistics.fmean(ordered), 2), "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1], "total": sum(ordered)}


def build_sft(cfg: GymforgeConfig, shard_files: Iterable[Path], tokenizer_dir: Path, *, jsonl_out: Path,
              dataset_out: Path, rollouts_out: Path, stats_out: Path,
              extra_sources: Iterable[str | Path] = (), excluded: Iterable[str] = ()) -> dict[str, Any]:
    """Filter every rollout of `shard_files`, then every trajectory of `extra_sources` (`sft.extra_sources`:
    MLGym run folders or gymforge shards, read by `gymforge.agent.sources`), write the examples (JSONL +
    `datasets` on disk), the per-rollout summary and the statistics; returns the statistics. Trajectories of the
    `excluded` slots are counted, never kept (`benchmark_overlap`)."""
    def candidates() -> Iterator[Candidate]:
        yield from shard_candidates(shard_files)
        for source in extra_sources:
            yield from import_candidates(Path(source), origin=str(source))

    return filter_examples(cfg, candidates(), tokenizer_dir, jsonl_out=jsonl_out, dataset_out=dataset_out,
                           rollouts_out=rollouts_out, stats_out=stats_out, excluded=excluded)


class _UnitWriter:
    """Writes a kept trajectory's examples of the units asked for (`written`) and counts every unit
    (`counters`). With a `TurnCache`, its turns are tokenized once for the conversation and its requests."""

    def __init__(self, tokenizer: Any, student: str, counters: dict[str, UnitCounter], written: dict[str, Any],
                 turns_cache: TurnCache | None) -> None:
        self.tokenizer, self.student, self.counters, self.written = tokenizer, student, counters, written
        self.turns_cache = turns_cache

    def add(self, c: Candidate, score: float | None, ids: list[int] | None, tokens: int | None, turns: int) -> None:
        messages = c.messages
        tokenizer, student, counters, written, turns_cache = (self.tokenizer, self.student, self.counters,
                                                              self.written, self.turns_cache)
        row = dict(slot=c.slot, task=c.task, rollout=c.rollout, seed=c.seed, teacher=c.teacher,
                   exit_status=c.exit_status, metric=c.metric, score=score, scores=json.dumps(c.scores),
                   source=json.dumps(c.source, sort_keys=True))
        if turns_cache is None:
            enc = tokenize_turns(tokenizer, messages or [], student)
        else:  # its turns, tokenized once for the conversation and its requests, checked against `ids`
            turns_cache.clear()
            enc = turns_cache.conversation(messages or [], ids or [])
        counters["conversation"].add(enc["input_ids"], enc["assistant_masks"], keep_end=False)
        if "conversation" in written:
            example = Example(id=c.id, messages=messages or [], tokens=tokens or 0, turns=turns,
                              unit="conversation", **row)
            written["conversation"].write(example.model_dump_json() + "\n")
        for k, chat in enumerate(c.reply_chats() if "request" in counters else []):
            enc = turns_cache.tokenize_turns(chat, last_only=True) if turns_cache is not None else \
                tokenize_turns(tokenizer, chat, student, last_only=True)
            counters["request"].add(enc["input_ids"], enc["assistant_masks"], keep_end=True)
            if "request" in written:
                example = Example(id=f"{c.id}-q{k:03d}", messages=chat, tokens=len(enc["input_ids"]),
                                  turns=sum(m["role"] == "assistant" for m in chat), unit="request",
                                  reply=k, **row)
                written["request"].write(example.model_dump_json() + "\n")


def filter_examples(cfg: GymforgeConfig, candidates: Iterable[Candidate], tokenizer_dir: Path, *, jsonl_out: Path,
                    dataset_out: Path, rollouts_out: Path, stats_out: Path, unit: str | None = None,
                    excluded: Iterable[str] = (), reuse_turns: bool = True) -> dict[str, Any]:
    """The filters (module docstring) over `candidates`, in order; writes the kept trajectories' examples of the
    example unit (`unit`, else `sft.example_unit`; `auto` resolved once every trajectory is filtered) as JSONL +
    `datasets` on disk, one summary line per candidate and the statistics (counts per reason, per task, per source
    and per example unit). The `request` examples tokenize each turn of a trajectory once
    (`gymforge.student.turn_cache`); `reuse_turns=False` tokenizes every request whole (the same examples, in
    O(turns^2) tokens: what the tests compare with)."""
    configured = unit or cfg.sft.example_unit
    if configured not in ("auto", *UNITS):
        raise ValueError(f"example unit {configured!r}: one of auto, {', '.join(UNITS)}")
    max_length = cfg.train.max_length
    tokenizer = load_tokenizer(tokenizer_dir)
    student = repr(cfg.train.student)
    # the request unit renders O(turns^2) text to count: skipped when `conversation` is asked for explicitly
    counters = {u: UnitCounter(max_length) for u in UNITS if u == "conversation" or configured != "conversation"}
    kept = Kept(excluded=frozenset(excluded))
    counts = FilterStats()

    Path(jsonl_out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(jsonl_out).parent, prefix=".sft-") as tmp, \
            contextlib.ExitStack() as files:
        summary_tmp = Path(tmp) / "rollouts.jsonl"
        summaries = files.enter_context(summary_tmp.open("w"))
        unit_tmp = {u: Path(tmp) / f"train.{u}.jsonl" for u in UNITS}
        # auto writes both units and keeps the one it resolves to: the longest kept trajectory is known at the end
        written = {u: files.enter_context(unit_tmp[u].open("w")) for u in UNITS if configured in ("auto", u)}
        units = _UnitWriter(tokenizer, student, counters, written,
                            TurnCache(tokenizer, student) if reuse_turns and "request" in counters else None)
        for c in candidates:
            origin = str(c.source.get("origin", "rollouts"))
            messages = c.messages
            turns = sum(m["role"] == "assistant" for m in messages or [])
            ids = chat_token_ids(tokenizer, messages) if messages else None
            tokens = len(ids) if ids is not None else None
            reason = reject_reason(c, tokens, kept, cfg.filter)
            counts.add(c, origin, tokens, turns, reason)
            score = last_score(c.scores, c.metric)
            if reason is None:
                kept.add(c)
                units.add(c, score, ids, tokens, turns)
            summaries.write(RolloutSummary(
                id=c.id, slot=c.slot, task=c.task, rollout=c.rollout, seed=c.seed, exit_status=c.exit_status,
                steps=c.steps, turns=turns, tokens=tokens, successful=c.successful, kept=reason is None,
                reason=reason, score=score, flags=c.flags, source=origin).model_dump_json() + "\n")
        files.close()
        resolved = resolve_unit(configured, max_length, counts.longest_kept)
        _write_dataset(unit_tmp[resolved], dataset_out)
        atomic.write_bytes(jsonl_out, unit_tmp[resolved].read_bytes())
        atomic.write_bytes(rollouts_out, summary_tmp.read_bytes())

    stats = _stats(cfg, counts, counters, tokenizer_dir=tokenizer_dir, configured=configured, resolved=resolved)
    atomic.write_json(stats_out, stats)
    return stats


def _stats(cfg: GymforgeConfig, counts: FilterStats, counters: dict[str, UnitCounter], *, tokenizer_dir: Path,
           configured: str, resolved: str) -> dict[str, Any]:
    """`sft/stats.json`: the filter settings, the example unit and why, and the counts."""
    max_length = cfg.train.max_length
    tasks, sources = counts.tasks, counts.sources
    return {
        "config_hash": config_hash(cfg),
        "teacher": dict(counts.teachers),
        "student": cfg.train.student,
        "tokenizer": str(tokenizer_dir),
        "filters": {"success": SUCCESS_RULE, "max_tokens": cfg.filter.max_tokens,
                    "max_per_task": cfg.filter.max_per_task,
                    "dedup": "exact match of the trajectory's conversation (final request plus reply)",
                    "exclude_flagged": cfg.filter.exclude_flagged,
                    "keep_eval_edit_rejected": cfg.filter.keep_eval_edit_rejected,
                    "order": list(REASONS)},
        "example_unit": resolved,
        "example": UNIT_RULES[resolved],
        "unit_choice": {"configured": configured, "max_length": max_length,
                        "longest_kept": counts.longest_kept,
                        "rule": "auto: request when train.max_length < the longest kept trajectory, else conversation"},
        "examples": counters[resolved].counts["examples"],
        "units": {u: counter.summary() for u, counter in counters.items()},
        "per_task_planned": cfg.trajectories.per_task,
        "rollouts": sum(t["rollouts"] for t in tasks.values()),
        "kept": sum(t["kept"] for t in tasks.values()),
        "discarded": {r: counts.reasons[r] for r in REASONS if counts.reasons[r]},
        "sources": {o: {"rollouts": s["rollouts"], "kept": s["kept"],
                        "discarded": {r: s["discarded"][r] for r in REASONS if s["discarded"][r]}}
                    for o, s in sources.items()},
        "tasks": len(tasks),
        "tasks_with_kept": sum(1 for t in tasks.values() if t["kept"]),
        "exit_status": {k: dict(v) for k, v in sorted(counts.exits.items())},
        "per_task": {slot: {"task_id": t["task_id"], "rollouts": t["rollouts"], "kept": t["kept"],
                            "discarded": dict(sorted(t["discarded"].items()))} for slot, t in sorted(tasks.items())},
        "audit": {"flagged_rollouts": len(counts.flagged), "excluded": cfg.filter.exclude_flagged,
                  "kept_codes": sorted(ATTEMPT_CODES) if cfg.filter.keep_eval_edit_rejected else [],
                  "by_code": dict(sorted(counts.flag_codes.items())), "rollouts": counts.flagged},
        "tokens": {"all": _summary(counts.tokens_all), "kept": _summary(counts.tokens_kept)},
        "turns": {"all": _summary(counts.turns_all), "kept": _summary(counts.turns_kept)},
    }


def _write_dataset(jsonl: Path, out: Path) -> None:
    import datasets

    features = _features()
    with tempfile.TemporaryDirectory() as cache, quiet_datasets():
        if jsonl.stat().st_size:
            ds = datasets.Dataset.from_json(str(jsonl), features=features, cache_dir=cache)
        else:
            ds = datasets.Dataset.from_dict({k: [] for k in features}, features=features)
        with atomic.directory(out) as tmp:
            ds.save_to_disk(str(tmp))


# ---- the steps (rules student_tokenizer, sft_dataset, sft_plots) --------------------------------------


def student_tokenizer(cfg: GymforgeConfig, templates: Path, envs: list[Path], out: Path) -> str:
    """The student's tokenizer: the hub's for a real student (from its prefetched folder when `train.prefetch`),
    offline one trained on templates and task texts."""
    folder = prefetched(cfg, cfg.train.student)
    source = str(require_offline_copy(folder, cfg.train.student)) if folder is not None else cfg.train.student
    built = build_tokenizer(source, Path(out), Path(templates), [Path(e) for e in envs])
    return f"{built}: {len(load_tokenizer(built))} tokens ({cfg.train.student})"


def sft_dataset(cfg: GymforgeConfig, shards: list[Path], tokenizer: Path, jsonl_out: Path, dataset_out: Path,
                rollouts_out: Path, stats_out: Path, decontamination: Path | None = None) -> str:
    """Filter the shards' rollouts (and `sft.extra_sources`) into the SFT dataset and its stats, leaving out the
    slots the decontamination report dropped."""
    stats = build_sft(cfg, shards, tokenizer, jsonl_out=jsonl_out, dataset_out=dataset_out,
                      rollouts_out=rollouts_out, stats_out=stats_out, extra_sources=cfg.sft.extra_sources,
                      excluded=dropped_items(decontamination) if decontamination else ())
    return (f"kept {stats['kept']} of {stats['rollouts']} trajectories from {stats['tasks']} tasks; "
            f"discarded {stats['discarded']}; {stats['examples']} examples, unit {stats['example_unit']}")


def sft_plots(stats: Path, rollouts: Path, kept_out: Path, stats_out: Path) -> list[Path]:
    """The trajectory stage's figures: kept trajectories per task and trajectory statistics."""
    from gymforge.report.sft_plots import plot_sft  # deferred: matplotlib (~0.5 s), which only this step uses

    return plot_sft(Path(stats), Path(rollouts), Path(kept_out), Path(stats_out))
