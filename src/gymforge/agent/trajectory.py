"""The `.traj` file (MLGym's layout plus our extras) and the per-run `results.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gymforge.core import atomic
from gymforge.agent.audit import Flag


class ModelStats(BaseModel):
    total_cost: float = 0.0
    task_cost: float = 0.0
    tokens_sent: int = 0
    tokens_received: int = 0
    api_calls: int = 0


class AgentInfo(BaseModel):
    model_stats: ModelStats = Field(default_factory=ModelStats)
    exit_status: str | None = None
    submission: str | None = None  # artefact path of the last successful evaluation
    score: list[dict[str, float]] = Field(default_factory=list)  # one entry per validate/submit, in order
    exit_detail: str | None = None  # why an evaluation failed, in the evaluator's words
    sandbox: str | None = None  # the sandbox backend the episode ran in ("local", "docker")
    confinement: str | None = None  # what confined it ("bwrap", "docker", "unshare-net", "none"); None: not reported
    flags: list[Flag] = Field(default_factory=list)  # every suspicious-action flag of the episode (gymforge.agent.audit)
    audit_notes: list[str] = Field(default_factory=list)  # where the audit could not see everything


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


class Trajectory(BaseModel):
    environment: str = "gymforge"
    trajectory: list[TrajectoryStep] = Field(default_factory=list)
    history: list[dict[str, Any]] = Field(default_factory=list)
    info: AgentInfo = Field(default_factory=AgentInfo)
    meta: dict[str, Any] = Field(default_factory=dict)  # task id, model, endpoint, seed, sandbox backend, ...


def write_trajectory(path: str | Path, traj: Trajectory) -> Path:
    return atomic.write_json(path, traj.model_dump(mode="json"))


def read_trajectory(path: str | Path) -> Trajectory:
    return Trajectory.model_validate(json.loads(Path(path).read_text()))


def write_results(path: str | Path, traj: Trajectory, baseline: dict[str, float] | None) -> Path:
    return atomic.write_json(path, {"agent": traj.info.score, "baseline": baseline})
