"""Stages 3.1-3.2 against the real offline teacher (loopback HTTP) and the offline hub."""

import json

import pytest

from gymforge.core.config import validate_config
from gymforge.hub import get_hub
from gymforge.stages.proposals import proposal, resolve_dataset
from gymforge.stages.topics import topic_batch


def make_cfg(tmp_path, **overrides):
    raw = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"), **overrides}
    return validate_config(raw)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hubcache")
    return get_hub(validate_config({"cache_dir": str(cache)}))


def test_resolution_exact_query_and_phantom(hub):
    assert resolve_dataset(hub, "sklearn/iris", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "SKLEARN/Iris", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "penguin species", 8) == "palmerpenguins/penguins"
    assert resolve_dataset(hub, "sklearn/irises", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "deepmind/kinetics-700", 8) is None


def test_topic_batches_are_deterministic_per_seed(tmp_path):
    outs = []
    for run, seed in [("a", 0), ("b", 0), ("c", 7)]:
        cfg = make_cfg(tmp_path / run, seed=seed)
        outs.append(topic_batch(cfg, "b0000", None, tmp_path / run / "b0000.json").raw)
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_cache_hit_on_rerun_makes_no_request(tmp_path):
    from gymforge.llm.ledger import Ledger

    cfg = make_cfg(tmp_path)
    first = topic_batch(cfg, "b0000", None, tmp_path / "first.json")
    sent = Ledger(cfg.results / "llm").request_count()
    again = topic_batch(cfg, "b0000", None, tmp_path / "again.json")
    assert Ledger(cfg.results / "llm").request_count() == sent == 1
    assert again.raw == first.raw and again.usage.cache_hits == 1 and again.usage.calls == 0


def _propose_many(tmp_path, hub, n_batches):
    cfg = make_cfg(tmp_path)
    previous, records = None, []
    for b in range(n_batches):
        out = tmp_path / f"b{b:04d}.json"
        batch = topic_batch(cfg, f"b{b:04d}", previous, out)
        previous = out
        for slot in batch.slots:
            records.append(proposal(cfg, slot.item, out, tmp_path / f"{slot.item}.json", hub=hub))
    return records


@pytest.fixture(scope="module")
def proposals(tmp_path_factory, hub):
    tmp = tmp_path_factory.mktemp("proposals")
    return tmp, _propose_many(tmp, hub, 6)


def test_proposals_cover_every_path(proposals):
    tmp_path, records = proposals
    by_status = {r.status for r in records}
    assert {"ok", "skipped"} <= by_status
    kept = [r for r in records if r.status == "ok"]
    # Data-backed proposals are enriched with features and example rows from the hub.
    with_data = [r for r in kept if r.dataset]
    assert with_data and all(r.dataset["features"] and r.dataset["example_rows"] for r in with_data)
    # Some teacher answers were not JSON at first and the nudge recovered them.
    assert any(r.nudges > 0 for r in kept)
    assert all(r.searches for r in with_data)
    discarded = [r for r in records if r.status == "discarded"]
    assert any(r.reason_code == "no_dataset_match" for r in discarded)
    for r in discarded:
        assert r.reason and r.proposal and r.dataset is None
    skipped = [r for r in records if r.status == "skipped"]
    assert all(r.reason_code == "duplicate_topic" for r in skipped)
    # A written record round-trips.
    path = tmp_path / f"{records[0].item}.json"
    assert json.loads(path.read_text())["item"] == records[0].item


def test_generation_repairs_invalid_drafts_and_is_deterministic(proposals, tmp_path):
    from gymforge.stages.generation import task_configs, starter_code

    src, records = proposals
    kept = [r for r in records if r.status == "ok"]
    outcomes = []
    for r in kept:
        cfg = make_cfg(tmp_path / "a")
        configs = task_configs(cfg, r.item, src / f"{r.item}.json", tmp_path / "a" / f"{r.item}.configs.json")
        code = starter_code(cfg, r.item, src / f"{r.item}.json", tmp_path / "a" / f"{r.item}.configs.json",
                                  tmp_path / "a" / r.item / "status.json", tmp_path / "a" / r.item / "mlgym")
        outcomes.append((r, configs, code))
    repaired = [c for _, c, _ in outcomes if c.status == "ok" and len(c.attempts) > 1]
    repaired += [k for _, _, k in outcomes if k.status == "ok" and len(k.attempts) > 1]
    assert repaired, "no first draft needed a repair"
    for draft in repaired:
        assert draft.attempts[0].errors and not draft.attempts[-1].errors
    done = [k for _, _, k in outcomes if k.status == "ok"]
    assert len(done) >= len(kept) // 2
    for k in done:
        assert (tmp_path / "a" / k.item / "mlgym" / "configs" / "tasks" / f"{k.task_id}.yaml").exists()

    # A fresh cache and the same seed give byte-identical configs.
    r, first, _ = outcomes[0]
    again = task_configs(make_cfg(tmp_path / "b"), r.item, src / f"{r.item}.json", tmp_path / "b" / "c.json")
    assert again.files == first.files
