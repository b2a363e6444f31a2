"""Fixtures of the early stages (topics -> proposals -> generation) against the real offline teacher (loopback
HTTP) and the offline hub: `make_cfg`, a hub, and one set
of proposals shared by the proposal and generation tests (a pytest plugin: see conftest.py)."""

import pytest

from gymforge.core.config import validate_config
from gymforge.hub import get_hub
from gymforge.stages.proposals import proposal
from gymforge.stages.topics import topic_batch


def make_cfg(tmp_path, **overrides):
    raw = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"), **overrides}
    return validate_config(raw)


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hubcache")
    return get_hub(validate_config({"cache_dir": str(cache)}))


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


@pytest.fixture(scope="session")
def proposals(tmp_path_factory, hub):
    tmp = tmp_path_factory.mktemp("proposals")
    return tmp, _propose_many(tmp, hub, 6)
