"""Exit statuses (`gymforge.core.records.Exit`): one format written by the loop and read back by every stage."""

from __future__ import annotations

import pytest

from gymforge.core.config import RewardConfig
from gymforge.core.records import AgentInfo, Exit, ExitStatus, Trajectory, TrajectoryStep, final_submission
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward
from gymforge.stages.evaluation import summarize
from gymforge.tools.show import step_scores

REASONS = ["submit", "max_steps", "cost", "context", "api", "format"]
# what the agent loop writes, as trajectory files on disk store it (MLGym's strings)
WRITTEN = ["submitted"] + [f"{code} ({reason})" for code in ("autosubmission", "submission_not_found",
                                                             "evaluation_format_error") for reason in REASONS]


@pytest.mark.parametrize("text", WRITTEN)
def test_stored_statuses_round_trip(text: str) -> None:
    ended = Exit.parse(text)
    assert isinstance(ended.code, ExitStatus) and str(ended) == text
    assert ended.reason == (None if text == "submitted" else text[text.index("(") + 1:-1])
    assert ended.failed is text.startswith(("submission_not_found", "evaluation_format_error"))
    assert ended.transient is text.endswith(("(api)", "(cost)"))


def test_formatting_and_foreign_statuses() -> None:
    assert str(Exit(ExitStatus.SUBMITTED)) == "submitted"
    assert str(Exit(ExitStatus.AUTOSUBMISSION, "max_steps")) == "autosubmission (max_steps)"
    assert Exit.parse("autosubmission (max_steps)") == Exit(ExitStatus.AUTOSUBMISSION, "max_steps")
    # another tool's status (MLGym's, an import) is kept verbatim, never an error
    for text in ("exit_cost", "early_exit (huh", "odd (a) (b)"):
        ended = Exit.parse(text)
        assert str(ended) == text and not ended.failed
    assert Exit.parse(None) == Exit.parse("") == Exit("") and not Exit.parse(None).failed


def test_final_submission_is_the_last_entry_unless_the_final_evaluation_failed() -> None:
    scores = [{"m": 1.0}, {"m": 2.0}]
    assert final_submission(scores, "submitted") == {"m": 2.0}
    assert final_submission(scores, "autosubmission (cost)") == {"m": 2.0}
    assert final_submission(scores, None) == {"m": 2.0}  # a foreign or missing status does not say it failed
    assert final_submission(scores, "submission_not_found (submit)") is None  # the last entry was a validate
    assert final_submission(scores, "evaluation_format_error (max_steps)") is None
    assert final_submission([], "submitted") is None


@pytest.mark.parametrize("status", WRITTEN)
@pytest.mark.parametrize("scores", [[], [{"m": 0.5}], [{"m": 0.5}, {"m": 0.7}]])
def test_stages_read_the_final_submission_alike(status: str, scores: list[dict[str, float]]) -> None:
    """The benchmark's run summary, the RL reward and `gymforge show` agree on whether there was one, and which."""
    steps = [TrajectoryStep(action=action, observation="", response="", state="{}", thought="", execution_time=0.0,
                            step=i + 1) for i, action in enumerate(["validate", "submit"])]
    traj = Trajectory(trajectory=steps, info=AgentInfo(exit_status=status, score=scores))
    final = final_submission(scores, status)
    assert summarize(traj, 0, 0, "f", 1.0).valid_submission is (final is not None)
    reward = episode_reward(Episode.of(traj), TaskMetric("m", True, 0.5), RewardConfig())
    assert reward.valid is (final is not None) and reward.score == (final["m"] if final else None)
    assert step_scores(traj)[-1] == final
