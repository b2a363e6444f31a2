"""Pydantic models of the per-item artefacts each stage writes; `schemas/` is generated from them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, model_serializer

from gymforge.core.tokens import TokenRecord

Status = Literal["ok", "discarded", "skipped"]


class UsageRecord(BaseModel):
    """LLM usage of one job (mirrors `gymforge.llm.client.Usage`)."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    reasoning_tokens: int = Field(0, description="Reasoning models' hidden tokens, counted within completion_tokens.")

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
    """The teacher's answer in the proposals stage."""

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
    kind: Literal["csv", "python", "model", "posttraining", "harbor"]
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


class CoherenceFinding(BaseModel):
    """One place where a task's text says something its own config, evaluator or data contradicts
    (`gymforge.tasks.coherence`)."""

    kind: Literal["metric", "direction", "file_name", "columns", "id_base", "dataset", "split", "target",
                  "placeholder", "submission"]
    evidence: str = Field(description="The sentence or line of the text, quoted.")
    stated: str = Field(description="What the text says.")
    actual: str = Field(description="What the task does instead.")
    file: str = Field(description="Where the text is (the task config), or the file that contradicts it.")
    by: Literal["rules", "teacher", "submission"] = Field(
        "rules", description="Who found it: the deterministic rules, the teacher's reading of the prose, or a "
        "submission written as the text says, which the evaluation refused.")


class CoherenceReport(BaseModel):
    """Whether a task says what it scores: its text against its config, evaluator and installed data."""

    coherent: bool = True
    findings: list[CoherenceFinding] = []
    checked: list[str] = Field([], description="The checks that ran (those without an input were skipped).")
    printed: dict[str, float] = Field({}, description="The metrics the evaluation printed for the baseline.")
    submission: dict[str, Any] | None = Field(
        None, description="The submission written from the text: file, header, first row, and the evaluation's "
        "metrics or its refusal.")
    teacher: str = Field("not asked", description="The teacher's verdict on the prose: coherent, incoherent, "
                         "not asked (the rules had found something, or the check was off) or failed: <why>.")
    seconds: float | None = None

    def evidence(self) -> str:
        """The findings as the teacher's repair reads them: which sentence, which value, which file."""
        lines = [f"- {f.kind}: the text says {f.stated!r} where {f.actual} (in {f.file}; "
                 f"{'found by ' + f.by}): \"{f.evidence}\"" for f in self.findings]
        return ("the task's text contradicts what it does; make the description state exactly what the evaluation "
                "computes and accepts:\n" + "\n".join(lines))


class VerificationIteration(BaseModel):
    iteration: int
    source: Literal["generation", "debug", "restart", "coherence"] = Field(
        description="Where this iteration's code came from: the first generation pass, a debug repair of the "
        "previous code (p_debug), a restart from the configs, or a repair of configs and code with the "
        "coherence check's evidence.")
    task_id: str | None = None
    errors: list[str] = []
    baseline_scores: dict[str, float] | None = None
    episode_exit_status: str | None = None
    probes: list[ProbeOutcome] = Field([], description="The evaluator probes run on this iteration's task "
                                       "(`gymforge.tasks.probes`), after its baseline.")
    gameable: bool = Field(False, description="A probe beat the baseline: the iteration failed for a gameable "
                           "evaluator.")
    headroom: dict[str, Any] | None = Field(None, description="Post-training tasks: the reference SFT against the "
                                            "base (`gymforge.tasks.posttraining.Headroom`: metric, base, reference, "
                                            "ok, reason, sft).")
    no_headroom: bool = Field(False, description="The reference SFT did not beat the base model: the iteration "
                              "failed for want of headroom.")
    coherence: CoherenceReport | None = Field(None, description="The task's text checked against its config, "
                                              "evaluator and data (`gymforge.tasks.coherence`), after its baseline.")
    incoherent: bool = Field(False, description="The text contradicted the task: the iteration failed as "
                             "incoherent_task.")
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
    needs_gpu: bool | None = Field(None, description="Whether the task's code needs a GPU (gymforge.runtime.resources."
                                   "needs_gpu): its micro variant and rollout shards ask for trajectories.gpus only "
                                   "then. None: not verified, or a report written before this field.")


class HarborAudit(BaseModel):
    """`gymforge check-task` on a Harbor task folder (`gymforge.tasks.harbor.check_harbor_task`): what Harbor's
    contract lets one check of a tests/test.sh verifier without knowing the task."""

    validator: str = Field(description="What read task.toml: Harbor's own TaskConfig where it imports, else "
                           "gymforge's reading of its schema.")
    schema_problems: list[str] = Field([], description="Why task.toml or the folder's layout is not Harbor's.")
    solution: dict[str, float] | None = Field(None, description="The verifier's rewards for solution/solve.sh.")
    nothing: dict[str, float] | None = Field(None, description="The verifier's rewards when the agent does "
                                             "nothing (Harbor's nop agent): the floor.")
    repeat: dict[str, float] | None = Field(None, description="The verifier run again on the solution's files.")
    deterministic: bool | None = Field(None, description="The two verifier runs on the same files agree.")
    leaks: list[str] = Field([], description="Answers the agent can read: a data file of tests/ or solution/, or "
                             "the solution's output, found in environment/.")
    not_carried_out: list[str] = Field([], description="Dockerfile lines gymforge's local sandbox does not run.")
    failures: list[str] = Field([], description="The checks that failed, in words; empty: the folder passed.")


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
    coherence: CoherenceReport | None = Field(None, description="The task's text against its config, evaluator "
                                              "and data (`gymforge.tasks.coherence`).")
    harbor: HarborAudit | None = Field(None, description="A Harbor task folder's checks (its baseline is the "
                                       "solution's score; the probe is doing nothing).")

    @property
    def gameable_probes(self) -> list[ProbeOutcome]:
        return [p for p in self.probes if p.gameable]


# ---- trajectories (`gymforge.agent` writes them, every later stage reads them) ------------------------


class ExitStatus(StrEnum):
    """How an episode ended: the code of `AgentInfo.exit_status`. The stored string is MLGym's: the code, then the
    reason in parentheses (`autosubmission (max_steps)`); `Exit` writes and reads it."""

    SUBMITTED = "submitted"  # the agent's `submit`, evaluated (no reason)
    AUTOSUBMISSION = "autosubmission"  # a limit ended the episode (reason: max_steps, cost, context, api, format)
    SUBMISSION_NOT_FOUND = "submission_not_found"  # the final evaluation found no artefact (reason: what ended it)
    EVALUATION_FORMAT_ERROR = "evaluation_format_error"  # the final evaluation could not read the artefact


# The final evaluation failed: the last score entry, if any, is an earlier `validate`, not the submission.
FAILED_EXITS = frozenset({ExitStatus.SUBMISSION_NOT_FOUND, ExitStatus.EVALUATION_FORMAT_ERROR})
# Reasons that say the endpoint or the budget failed, not the agent: such an episode is retried, never kept.
TRANSIENT_REASONS = frozenset({"api", "cost"})


@dataclass(frozen=True)
class Exit:
    """An exit status as code and reason; `str()` gives the stored form, `Exit.parse` reads it back."""

    code: ExitStatus | str  # a str: a code gymforge does not write (another tool's), kept verbatim
    reason: str | None = None

    def __str__(self) -> str:
        return str(self.code) if self.reason is None else f"{self.code} ({self.reason})"

    @classmethod
    def parse(cls, text: str | None) -> Exit:
        """`"autosubmission (cost)"` -> Exit(AUTOSUBMISSION, "cost"); None (no status yet) -> Exit("")."""
        code, reason = text or "", None
        head, sep, rest = code.partition(" (")
        if sep and rest.endswith(")"):
            code, reason = head, rest[:-1]
        try:
            return cls(ExitStatus(code), reason)
        except ValueError:
            return cls(code, reason)

    @property
    def failed(self) -> bool:
        """The final evaluation failed (no artefact, or one it could not read)."""
        return self.code in FAILED_EXITS

    @property
    def transient(self) -> bool:
        """The endpoint or the budget ended the episode (`(api)`, `(cost)`): worth running again."""
        return self.reason in TRANSIENT_REASONS


_Entry = TypeVar("_Entry", bound=Mapping[str, Any])


def final_submission(scores: Sequence[_Entry], exit_status: str | None) -> _Entry | None:
    """The final submission's score entry: the last one, unless the exit status says the final evaluation failed
    (then the last entry is an earlier `validate`'s); None when there is none."""
    if not scores or Exit.parse(exit_status).failed:
        return None
    return scores[-1]


class Flag(BaseModel):  # a suspicious-action flag of the audit (gymforge.agent.audit)
    code: str  # one of gymforge.agent.audit.CODES
    detail: str  # what was seen, in workspace-relative or sandbox paths (never host paths)
    step: int = 0  # the agent step it was seen after


class ModelStats(BaseModel):
    total_cost: float = 0.0
    task_cost: float = 0.0
    tokens_sent: int = 0
    tokens_received: int = 0
    api_calls: int = 0


class AgentInfo(BaseModel):
    model_stats: ModelStats = Field(default_factory=ModelStats)
    exit_status: str | None = None  # `Exit` as stored: "submitted", "autosubmission (max_steps)", ...
    submission: str | None = None  # artefact path of the last successful evaluation
    score: list[dict[str, float]] = Field(default_factory=list)  # one entry per validate/submit, in order
    exit_detail: str | None = None  # why an evaluation failed, in the evaluator's words
    sandbox: str | None = None  # the sandbox backend the episode ran in ("local", "docker")
    confinement: str | None = None  # what confined it ("bwrap", "docker", "unshare-net", "none"); None: not reported
    flags: list[Flag] = Field(default_factory=list)  # every suspicious-action flag of the episode (gymforge.agent.audit)
    audit_notes: list[str] = Field(default_factory=list)  # where the audit could not see everything
    # What the interface comparison counts (agent.interface, docs/post-training.md#workflow-interface): the agent's
    # actions that failed (non-zero exit, timeout, refused command, tool error, an evaluation with nothing to score)
    # and train-to-eval iterations (scored evaluations with training finished since the previous one).
    failed_actions: int = 0
    train_eval_iterations: int = 0


class TrajectoryStep(BaseModel):
    # MLGym's fields
    action: str
    observation: str
    response: str
    state: str  # JSON {"open_file", "working_dir"} before the action
    thought: str
    execution_time: float
    # extras
    step: int
    query_time: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    exit_code: int | None = None
    timed_out: bool = False
    limit: str | None = None  # the sandbox limit that stopped the command, in words
    flags: list[Flag] = Field(default_factory=list)  # suspicious-action flags of this step
    format_errors: list[dict[str, str]] = Field(default_factory=list)  # rejected replies: {"response", "error"}
    # Served models only: the sampled tokens of each reply of this step, rejected ones first, then the accepted one
    # (`gymforge.core.tokens`; None for a reply whose endpoint returned no ids). Absent in older trajectories.
    tokens: list[TokenRecord | None] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_tokens(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("tokens", 0) is None:  # steps of teachers and external APIs keep MLGym's keys only
            del data["tokens"]
        return data


class Trajectory(BaseModel):  # the `.traj` file (gymforge.agent.trajectory reads and writes it)
    environment: str = "gymforge"
    trajectory: list[TrajectoryStep] = Field(default_factory=list)
    history: list[dict[str, Any]] = Field(default_factory=list)
    info: AgentInfo = Field(default_factory=AgentInfo)
    meta: dict[str, Any] = Field(default_factory=dict)  # task id, model, endpoint, seed, sandbox backend, ...


# ---- rollouts (the rollouts stage) -------------------------------------------------------------------------------


class TeacherRef(BaseModel):
    provider: str
    model: str = Field(description="Model name sent to the endpoint (an offline teacher may carry a skill suffix).")
    endpoint: str = Field(description="Base URL the requests went to (credentials stripped).")
    temperature: float
    max_tokens: int


class SandboxRef(BaseModel):
    backend: str
    confinement: str | None = None
    image: str | None = None


class RolloutRecord(BaseModel):
    """One teacher episode: the MLGym-compatible trajectory (`.traj` keys) plus where and how it was produced.

    Per-step token counts (`prompt_tokens`, `completion_tokens`) and timings (`query_time`,
    `execution_time`) are fields of every `trajectory.trajectory[*]` step.
    """

    slot: str
    task_id: str
    rollout: int = Field(description="Index of the rollout within its task, 0 .. per_task - 1.")
    seed: int = Field(description="derive_seed(run seed, 'rollout', slot, rollout); sent with every request.")
    teacher: TeacherRef
    sandbox: SandboxRef
    max_steps: int
    baseline: dict[str, float] | None = Field(None, description="The task's baseline metrics the agent was shown.")
    fingerprint: str = Field(description="Hash of what determines this rollout (config sections + verified task).")
    wall_s: float
    trajectory: Trajectory


class ShardRecord(ItemRecord):
    shard: int
    task_id: str | None = None
    rollout_indices: list[int] = []
    fingerprint: str | None = None
    resumed: int = Field(0, description="Rollouts taken from a previous, interrupted run of this shard.")
    rollouts: list[RolloutRecord] = []


# ---- SFT data (the SFT data stage) -------------------------------------------------------------------------------


class Example(BaseModel):
    """One line of `train.jsonl` / one row of the dataset."""

    id: str = Field(description="<slot>-r<rollout>; imported: the source's relative path; `request` unit: that "
                    "id plus `-q<reply>`")
    messages: list[dict[str, str]]
    slot: str
    task: str
    rollout: int
    seed: int | None = Field(description="The rollout's seed; null when the source does not record one (MLGym).")
    teacher: str = Field(description="The model that wrote the replies.")
    exit_status: str
    metric: str | None = Field(description="The task's priority metric (first baseline metric).")
    score: float | None = Field(description="Value of `metric` in the last score entry (the final submission).")
    scores: str = Field(description="JSON list of every score entry, in order.")
    tokens: int = Field(description="Student-tokenizer tokens of `messages`, chat template applied.")
    turns: int = Field(description="Assistant turns in `messages`.")
    source: str = Field(description="JSON object: where the trajectory came from (`origin`: `rollouts` or the "
                        "`sft.extra_sources` entry / import directory; `format`: gymforge-shard, gymforge-traj or "
                        "mlgym; `path` relative to it; for MLGym runs the run folder's model and history processor).")
    unit: Literal["conversation", "request"] = Field(
        "conversation", description="The example unit (`sft.example_unit`), which says which assistant turns are "
        "trained: `conversation`, every one; `request`, only the last (the reply; the earlier ones are the request's "
        "history). A dataset without this column trains every assistant turn.")
    reply: int | None = Field(None, description="`request` unit: the index of the trained reply among its "
                              "trajectory's accepted replies (0-based; the id ends in `-q<reply>`); else null.")


# ---- benchmark runs (the evaluation stage) -------------------------------------------------------------------------


class RunSummary(BaseModel):
    run: int
    seed: int
    folder: str = Field(description="The MLGym run folder, relative to the record's directory.")
    exit_status: str | None
    scores: list[dict[str, float]]
    replies: int = Field(description="Model replies in the run, re-asked malformed ones included.")
    malformed: int = Field(description="Replies that broke the one-discussion-one-command format.")
    steps: int
    valid_submission: bool = Field(description="The run ended with a scored submission.")
    wall_s: float


class EvalRecord(ItemRecord):
    """`item` is `<model>/<task>`."""

    model: str
    task_id: str
    served_as: str | None = Field(None, description="Model name sent to the endpoint.")
    baseline: dict[str, float] | None = None
    fingerprint: str
    resumed: int = 0
    runs: list[RunSummary] = []
