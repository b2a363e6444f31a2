"""Stage 3.3, rules task_configs and starter_code: drafts, repairs and determinism."""

from stage_fixtures import make_cfg


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
