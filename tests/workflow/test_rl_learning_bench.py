"""bench/rl_learning.py's statistics (issue #24): the quarters of a reward curve and the bootstrap interval of their
difference pooled over seeds. No RL run: curves are made here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gymforge.stages.rl import quarter_means

_spec = importlib.util.spec_from_file_location("rl_learning", Path(__file__).parents[2] / "bench" / "rl_learning.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

FAIL, PASS = -1.0, 0.3


def group(passes: int, size: int = 6) -> list[float]:
    return [PASS] * passes + [FAIL] * (size - passes)


@pytest.mark.parametrize("n", [2, 3, 7, 8, 13, 24])
def test_quarters_are_those_of_curve_json(n: int) -> None:
    rewards = [float(i) for i in range(n)]
    first, last = bench.quarters(rewards)
    rows = [{"mean_reward": r} for r in rewards]
    assert (sum(first) / len(first), sum(last) / len(last)) == quarter_means(rows)


def test_quarters_need_two_iterations() -> None:
    with pytest.raises(ValueError):
        bench.quarters([0.5])


def test_a_rising_curve_gives_an_interval_above_zero() -> None:
    curves = [[group(0), group(1), group(1), group(2), group(3), group(3), group(4), group(5)],
              [group(1), group(0), group(2), group(2), group(3), group(4), group(5), group(4)]]
    stats = bench.rise(curves, samples=2000, seed=0)
    step = (PASS - FAIL) / 6  # one more pass in a group of 6
    assert stats["per_seed"] == pytest.approx([4 * step, 4 * step])  # quarters of 2 iterations: 0.5 -> 4.5 passes
    assert stats["mean"] == pytest.approx(4 * step)
    lo, hi = stats["interval"]
    assert 0 < lo <= stats["mean"] <= hi
    assert stats["excludes_zero"]


def test_a_flat_curve_includes_zero_and_the_interval_is_seeded() -> None:
    curves = [[group(1), group(2), group(1), group(0), group(2), group(1), group(2), group(1)]] * 3
    stats = bench.rise(curves, samples=2000, seed=3)
    lo, hi = stats["interval"]
    assert stats["mean"] == pytest.approx(0.0)
    assert lo < 0 < hi and not stats["excludes_zero"]
    assert bench.rise(curves, samples=2000, seed=3) == stats
    assert bench.rise(curves, samples=2000, seed=4)["interval"] != stats["interval"]


def test_episodes_count_not_only_iterations() -> None:
    """Constant iteration means still leave the episodes' noise: one pass in 6 in every late iteration is no
    certain rise over none."""
    stats = bench.rise([[group(0), group(0), group(1), group(1)]], samples=2000)
    lo, hi = stats["interval"]
    assert stats["per_seed"] == [pytest.approx((PASS - FAIL) / 6)]
    assert lo == pytest.approx(0.0) and hi > stats["mean"]


def test_episode_rewards_read_the_episode_files(tmp_path: Path) -> None:
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "iteration_0000.json").write_text(json.dumps([{"reward": FAIL, "valid": False},
                                                                          {"reward": PASS, "valid": True}]))
    curve = {"iterations": [{"iteration": 0, "mean_reward": -0.35, "valid_share": 0.5},
                            {"iteration": 1, "mean_reward": -1.0, "valid_share": 0.0}]}
    assert bench.episode_rewards(tmp_path, curve) == [[FAIL, PASS], [-1.0]]
    # the valid-submission share, which no reward weight changes, from the same files
    assert bench.episode_rewards(tmp_path, curve, key="valid") == [[0.0, 1.0], [0.0]]
