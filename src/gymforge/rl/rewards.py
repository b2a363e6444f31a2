"""The shaped reward of one RL episode, from honest scores and structured events only.

Inputs are what our own agent loop and evaluation recorded in the `Trajectory`, never text the policy
printed: `info.score` (one metrics dict per evaluation that read the artefact, appended by the loop after
the task's own evaluation ran), `info.exit_status` (set by the loop), each step's `exit_code` (from the
sandbox) and `info.flags` (the suspicious-action audit). A reply that prints "Evaluation Score: 0.99"
changes none of them.

    reward = improvement_weight * clip(direction * (score - baseline) / scale, -clip, +clip)   (valid submission)
           + sum of the milestone credits reached
           + well_formed * (well-formed replies / all replies)
           + no_submission_penalty                                                            (no valid submission)

- `score` is the priority metric of the final submission (the last score entry unless the final evaluation
  failed, `gymforge.core.records.final_submission`: MLGym's Best Submission);
  `direction` is +1 when higher is better, -1 when lower is better; `scale` is `max(|baseline|,
  scale_floor)`, so a relative improvement of 10% weighs the same on an accuracy task and a loss task.
- Milestones (the paper's "+0.1 per milestone"; weights `rl.reward.milestone_<name>`, read as the dict
  `RewardConfig.milestones`): `ran_code` (a command that ran python exited 0 in the sandbox:
  `gymforge.agent.tools.is_training_command`), `artefact` (the evaluation found the submission artefact: a
  score entry, or an evaluation that failed only on its format), `evaluated` (the evaluation produced a valid
  numeric metric), `beat_baseline` (the final submission is strictly better than the baseline).
- With `rl.reward.well_formed` > 0, every episode also gets that weight times the share of its replies that the loop
  accepted as actions (the rest were format errors, each re-asked; `gymforge.agent.trajectory.reply_counts`). A
  student whose episodes all end on three malformed replies earns the same -1 in every episode, so a group has no
  reward variance and teaches nothing; the share separates an episode of two well-formed commands from one of none.
  Off by default: the group's advantages are divided by its standard deviation, so reward differences of a few
  hundredths become full-size steps (tried at 0.2 on such a student: its KL to the SFT student reached 108 in six
  iterations, docs/rl.md).
- An episode without a valid final submission gets `no_submission_penalty` (the paper: a large failure
  penalty) and no improvement term.
- A flagged episode (any audit flag) gets no reward: no milestone credit and no improvement, only the
  no-submission penalty, so that tripping the audit is never cheaper than failing honestly. An episode whose
  only flags are attempts without an effect (`eval_edit_rejected`: an edit of an evaluation script that the
  read-only file or the tool rejected) follows `rl.reward.eval_edit_rejected`: `penalize` (the default)
  treats it as flagged, `ignore` rewards it as if it had no flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gymforge.agent.audit import ATTEMPT_CODES
from gymforge.agent.trajectory import reply_counts
from gymforge.agent.tools import is_training_command
from gymforge.core.config import RewardConfig
from gymforge.core.metrics import valid_metric, valid_metrics
from gymforge.core.records import Exit, ExitStatus, final_submission

@dataclass(frozen=True)
class TaskMetric:
    """The metric that ranks a task's scores and its baseline value."""

    metric: str
    higher_is_better: bool
    baseline: float | None


@dataclass
class Episode:
    """What the reward reads from one trajectory (all of it recorded by the loop, the evaluation or the audit)."""

    scores: list[dict[str, float]]
    exit_status: str | None
    exit_codes: list[tuple[str, int | None]] = field(default_factory=list)  # (action, sandbox exit code) per step
    flagged: bool = False
    flags: list[str] = field(default_factory=list)  # the audit's flag codes, once each (empty: unknown)
    well_formed: int = 0  # replies the loop accepted as actions
    malformed: int = 0  # replies it rejected as format errors

    @classmethod
    def of(cls, traj: Any) -> "Episode":
        well_formed, malformed = reply_counts(traj)
        return cls(scores=list(traj.info.score), exit_status=traj.info.exit_status,
                   exit_codes=[(s.action, s.exit_code) for s in traj.trajectory],
                   flagged=bool(traj.info.flags), flags=sorted({f.code for f in traj.info.flags}),
                   well_formed=well_formed, malformed=malformed)

    @property
    def well_formed_share(self) -> float:
        replies = self.well_formed + self.malformed
        return self.well_formed / replies if replies else 0.0


@dataclass
class Reward:
    reward: float
    valid: bool
    score: float | None
    improvement: float
    milestones: dict[str, bool]
    flagged: bool  # rewarded as flagged (an ignored `eval_edit_rejected` alone is not)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _value(entry: Mapping[str, Any], metric: str) -> float | None:
    """The priority metric of a score entry; a task whose entries name it differently uses its only metric."""
    if metric in entry:
        return valid_metric(entry[metric])
    numbers = list(valid_metrics(entry).values())
    return numbers[0] if len(numbers) == 1 else None


def improvement(score: float, task: TaskMetric, scale_floor: float) -> float:
    """Signed improvement over the baseline, relative to the baseline's magnitude (positive: better)."""
    if task.baseline is None:
        return 0.0
    direction = 1.0 if task.higher_is_better else -1.0
    return direction * (score - task.baseline) / max(abs(task.baseline), scale_floor)


def penalized(episode: Episode, weights: RewardConfig) -> bool:
    """Whether the episode's flags cost it its reward: any flag, but `eval_edit_rejected` alone when the policy
    (`weights.eval_edit_rejected`) is `ignore`."""
    if not episode.flagged:
        return False
    tolerated = set(ATTEMPT_CODES) if weights.eval_edit_rejected == "ignore" else set()
    return not (episode.flags and set(episode.flags) <= tolerated)


def episode_reward(episode: Episode, task: TaskMetric, weights: RewardConfig) -> Reward:
    ended = Exit.parse(episode.exit_status)
    final = final_submission(episode.scores, episode.exit_status)
    score = _value(final, task.metric) if final is not None else None
    valid = score is not None
    milestones = {
        "ran_code": any(code == 0 and is_training_command(action) for action, code in episode.exit_codes),
        "artefact": bool(episode.scores) or ended.code == ExitStatus.EVALUATION_FORMAT_ERROR,
        "evaluated": any(_value(e, task.metric) is not None for e in episode.scores),
        "beat_baseline": valid and improvement(score, task, weights.scale_floor) > 0,  # type: ignore[arg-type]
    }
    if penalized(episode, weights):
        return Reward(weights.no_submission_penalty, False, score, 0.0, milestones, True)
    gain = 0.0
    if valid:
        raw = improvement(score, task, weights.scale_floor)  # type: ignore[arg-type]
        gain = max(-weights.improvement_clip, min(weights.improvement_clip, raw))
    credit = sum(weights.milestones[name] for name, hit in milestones.items() if hit)
    credit += weights.well_formed * episode.well_formed_share
    total = weights.improvement_weight * gain + credit + (0.0 if valid else weights.no_submission_penalty)
    return Reward(round(total, 6), valid, score, gain, milestones, False)
