"""Pydantic models of the per-item artefacts each stage writes; `schemas/` is generated from them."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "discarded", "skipped"]


class UsageRecord(BaseModel):
    """LLM usage of one job (mirrors `gymforge.llm.client.Usage`)."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: BaseModel) -> None:
        """Accumulate another usage record (or `gymforge.llm.client.Usage`) into this one."""
        for field in UsageRecord.model_fields:
            setattr(self, field, getattr(self, field) + getattr(other, field))


class ItemRecord(BaseModel):
    """Common head of every per-item output: did it survive this stage, and if not, why."""

    item: str = Field(description="Topic slot id (`t0000`...), stable across reruns and the key of every later stage.")
    status: Status
    reason_code: str | None = Field(None, description="Short machine-readable discard category, e.g. `no_dataset_match`.")
    reason: str | None = Field(None, description="Human-readable detail of the discard.")
    usage: UsageRecord = UsageRecord()


class TopicSlot(ItemRecord):
    topic: str | None = None
    topic_hash: str | None = Field(None, description="Content hash of the normalised topic text.")
    duplicate_of: str | None = None


class TopicBatch(BaseModel):
    batch: str
    requested: int
    raw: list[str] = Field(description="Topics exactly as the teacher returned them.")
    slots: list[TopicSlot]
    seen: list[str] = Field(description="All accepted topics up to and including this batch (prompt context for the next).")
    usage: UsageRecord = UsageRecord()
    nudges: int = 0

    def summary(self) -> str:
        """The job log's line for this batch (`gymforge topic-batch`)."""
        return f"{self.batch}: {sum(s.status == 'ok' for s in self.slots)}/{len(self.slots)} topics kept"


class TaskProposal(BaseModel):
    """The teacher's answer in stage 3.2."""

    topic: str
    metric: str
    description: str
    dataset: str | None = None


class ProposalRecord(ItemRecord):
    topic: str | None = None
    proposal: TaskProposal | None = None
    dataset: dict[str, Any] | None = Field(None, description="Resolved dataset details (features, example rows).")
    searches: list[str] = []
    nudges: int = 0


class Attempt(BaseModel):
    errors: list[str] = []


class GenerationRecord(ItemRecord):
    """Outcome of a generation stage (configs or starter code)."""

    task_id: str | None = None
    entrypoint: str | None = None
    dataset_id: str | None = None
    files: dict[str, str] = Field(default_factory=dict, description="Relative path -> text of the validated files.")
    attempts: list[Attempt] = []


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from the run seed and item keys (never Python's salted hash)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


class ProbeOutcome(BaseModel):
    """One evaluator probe (`gymforge.tasks.probes`): a knowledge-free degenerate submission and its fate."""

    name: str
    kind: Literal["csv", "python", "model"]
    description: str
    submission_file: str = Field(description="The workspace file the probe wrote (the one quoted below).")
    submission: str = Field(description="The start of that file.")
    rejected: str | None = Field(None, description="Why the evaluation refused it; None when it was scored.")
    applicable: bool = Field(True, description="False where the probe has no degenerate form for this task "
                             "(zeros of a function that returns a number): it was not scored.")
    metrics: dict[str, float] | None = None
    score: float | None = Field(None, description="The priority metric of `metrics`.")
    gameable: bool = Field(False, description="Accepted with a score strictly better than the baseline's.")
    seconds: float | None = None


class VerificationIteration(BaseModel):
    iteration: int
    source: Literal["generation", "debug", "restart"] = Field(
        description="Where this iteration's code came from: the first generation pass, a debug repair of the "
        "previous code (p_debug), or a restart from the configs.")
    task_id: str | None = None
    errors: list[str] = []
    baseline_scores: dict[str, float] | None = None
    episode_exit_status: str | None = None
    probes: list[ProbeOutcome] = Field([], description="The evaluator probes run on this iteration's task "
                                       "(`gymforge.tasks.probes`), after its baseline.")
    gameable: bool = Field(False, description="A probe beat the baseline: the iteration failed for a gameable "
                           "evaluator.")
    timings_s: dict[str, float] = {}


class VerificationReport(ItemRecord):
    task_id: str | None = None
    entrypoint: str | None = None
    iterations: list[VerificationIteration] = []
    baseline_scores: list[dict[str, float]] = []
    hidden_columns: dict[str, list[str]] | None = Field(
        None, description="Dataset columns withheld from the agent and given to evaluation as answers.csv.")
    metric: str | None = Field(None, description="The metric that ranks the task's scores, as its evaluation "
                               "names it (what the evaluator probes compared).")
    higher_is_better: bool | None = None


class CheckReport(BaseModel):
    """`gymforge check-task`: the task's evaluator probed; `gameable` when any probe beat the baseline."""

    task_id: str
    entrypoint: str
    metric: str
    higher_is_better: bool
    baseline: float
    baseline_source: Literal["measured", "recorded"]
    probes: list[ProbeOutcome] = []
    gameable: bool = False
    seconds: float | None = None

    @property
    def gameable_probes(self) -> list[ProbeOutcome]:
        return [p for p in self.probes if p.gameable]
