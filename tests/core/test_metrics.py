"""gymforge.core.metrics: what a valid metric value is, and that every reader of scores applies that one rule."""

from __future__ import annotations

import json
import math

import pytest

from gymforge.agent import EvaluationFormatError
from gymforge.benchmark import aup
from gymforge.core.config import RewardConfig
from gymforge.core.metrics import has_valid_metric, last_score, valid_metric, valid_metrics
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward
from gymforge.tasks.environment import parse_metrics

EDGES = [
    (0.5, 0.5), (3, 3.0), (0, 0.0), (-2.5, -2.5), (1e308, 1e308),
    (math.nan, None), (math.inf, None), (-math.inf, None), (10**400, None),  # not finite (the int overflows a float)
    (True, None), (False, None),  # bools are ints to Python, never metrics
    ("0.5", None), ("nan", None), (None, None), ([1.0], None), ({"v": 1.0}, None),
]
IDS = [repr(value)[:12] for value, _ in EDGES]


@pytest.mark.parametrize("value, expected", EDGES, ids=IDS)
def test_valid_metric_edge_cases(value, expected) -> None:
    got = valid_metric(value)
    assert got == expected and (got is None or type(got) is float)
    assert has_valid_metric({"m": value}) is (expected is not None)
    assert valid_metrics({"m": value, "ok": 1}) == ({"m": expected, "ok": 1.0} if expected is not None else {"ok": 1.0})


def test_last_score_is_the_last_entrys_valid_value() -> None:
    assert last_score([{"m": 5.0}, {"m": 1}], "m") == 1.0  # the last, even though worse
    assert last_score([{"m": 5.0}, {"other": 1.0}], "m") is None
    assert last_score([{"m": 5.0}, {"m": math.nan}], "m") is None
    assert last_score([], "m") is None and last_score([{"m": 1.0}], None) is None


@pytest.mark.parametrize("value, expected", EDGES, ids=IDS)
def test_every_reader_of_scores_applies_the_same_rule(value, expected) -> None:
    """The evaluation's output, AUP's final submission and the RL reward agree with `valid_metric` on each value."""
    meta = aup.TaskMeta(id="t", metric="m", higher_is_better=True)
    assert aup.best_submission([{"m": value}], meta) == expected
    assert aup.best_attempt([{"m": value}], meta) == expected
    reward = episode_reward(Episode(scores=[{"m": value}], exit_status="submitted"), TaskMetric("m", True, None),
                            RewardConfig())
    assert reward.score == expected and reward.milestones["evaluated"] is (expected is not None)
    try:
        text = json.dumps({"m": value})
    except (TypeError, ValueError):
        return
    if expected is None:
        with pytest.raises(EvaluationFormatError):
            parse_metrics(text)
    else:
        assert parse_metrics(text) == {"m": expected}
