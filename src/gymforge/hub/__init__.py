"""Dataset hubs: `get_hub` picks the backend named by `datasets.hub` in the config."""

from __future__ import annotations

from gymforge.core import plugins
from gymforge.core.config import GymforgeConfig
from gymforge.hub.base import DatasetCard, DatasetDetails, DatasetHub, DatasetNotFound
from gymforge.hub.huggingface import HubUnavailable, HuggingFaceHub

__all__ = [
    "DatasetCard", "DatasetDetails", "DatasetHub", "DatasetNotFound", "HubUnavailable", "HuggingFaceHub",
    "get_hub",
]


def get_hub(cfg: GymforgeConfig) -> DatasetHub:
    """The configured hub; the offline one lives under the cache dir and is built on first use."""
    if cfg.datasets.hub == "huggingface":
        return HuggingFaceHub()
    return plugins.load("offline-hub")(cfg.cache / "hub")
