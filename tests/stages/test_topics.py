"""Stage 3.1, rule topic_batch: topic batches against the real offline teacher (loopback HTTP)."""

from gymforge.stages.topics import topic_batch
from stage_fixtures import make_cfg


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
