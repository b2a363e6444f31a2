"""Stage 3.2, rule proposal: dataset-grounded proposals against the offline teacher and the offline hub."""

import json

from gymforge.stages.proposals import resolve_dataset


def test_resolution_exact_query_and_phantom(hub):
    assert resolve_dataset(hub, "sklearn/iris", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "SKLEARN/Iris", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "penguin species", 8) == "palmerpenguins/penguins"
    assert resolve_dataset(hub, "sklearn/irises", 8) == "sklearn/iris"
    assert resolve_dataset(hub, "deepmind/kinetics-700", 8) is None


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
