"""The production backend: the real Hugging Face Hub via `huggingface_hub` and `datasets`."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gymforge.core import atomic
from gymforge.hub.base import DatasetCard, DatasetDetails, DatasetNotFound
from gymforge.hub.data import _STOPWORDS, feature_dtypes, quiet_datasets, split_train_test, tokenize

if TYPE_CHECKING:
    from huggingface_hub.hf_api import DatasetInfo

# Card metadata too bulky for a prompt; `describe` reports features and splits instead.
_BULKY_CARD_KEYS = ("dataset_info", "configs")
# The hub's `search` is a substring match on ids, so a multi-word query is also tried word by word.
_MAX_WORD_SEARCHES = 4
_MAX_STRING = 500


class HubUnavailable(ConnectionError):
    """The hub cannot be reached (offline mode); distinct from a dataset that does not exist."""


def hub_offline() -> bool:
    """Offline mode as set now; `huggingface_hub` only reads the variables when first imported."""
    from huggingface_hub import constants

    flags = (os.environ.get(v, "").upper() for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(f in {"1", "ON", "YES", "TRUE"} for f in flags)


def card_from_info(info: DatasetInfo) -> DatasetCard:
    """Map an `HfApi` DatasetInfo (from `list_datasets(full=True)` or `dataset_info`) to a DatasetCard."""
    card_data = info.card_data.to_dict() if info.card_data is not None else {}
    for key in _BULKY_CARD_KEYS:
        card_data.pop(key, None)
    tags = list(info.tags or [])
    license_ = next((t.split(":", 1)[1] for t in tags if t.startswith("license:")), None)
    if license_ is None and card_data.get("license"):
        lic = card_data["license"]
        license_ = lic[0] if isinstance(lic, list) else str(lic)
    if "task_categories" not in card_data:
        categories = [t.split(":", 1)[1] for t in tags if t.startswith("task_categories:")]
        if categories:
            card_data["task_categories"] = categories
    description = (info.description or card_data.get("pretty_name") or "").strip()
    return DatasetCard(id=info.id, description=description, tags=tags, downloads=info.downloads or 0,
                       likes=info.likes or 0, license=license_, card_data=card_data)


def json_safe(value: Any) -> Any:
    """Example-row values a prompt can hold: images, audio and bytes become short placeholders."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # NaN is not JSON
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING else value[:_MAX_STRING] + "..."
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [json_safe(v) for v in value[:20]]
        return items + ["..."] if len(value) > 20 else items
    return f"<{type(value).__name__}>"


@contextmanager
def _not_found_as(dataset_id: str) -> Iterator[None]:
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        yield
    except (RepositoryNotFoundError, DatasetNotFoundError) as err:
        raise DatasetNotFound(
            f"dataset {dataset_id!r} was not found on the Hugging Face Hub (or is private/gated without access)"
        ) from err
    except OfflineModeIsEnabled as err:
        raise HubUnavailable(f"cannot reach the Hugging Face Hub for {dataset_id!r}: offline mode is on") from err


class HuggingFaceHub:
    name = "huggingface"

    def __init__(self, token: str | None = None):
        self.token = token

    def _require_online(self, what: str) -> None:
        if hub_offline():
            raise HubUnavailable(
                f"{what} needs the Hugging Face Hub API, but HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set; "
                "unset it or use `datasets.hub: offline`"
            )

    def _api(self) -> Any:
        from huggingface_hub import HfApi

        return HfApi(token=self.token)

    def search(self, query: str, limit: int = 10) -> list[DatasetCard]:
        self._require_online("search")
        api = self._api()

        def listing(text: str) -> list[DatasetInfo]:
            return list(api.list_datasets(search=text, limit=limit, sort="downloads", full=True))

        first = listing(query.strip())
        if len(first) >= limit:
            return [card_from_info(i) for i in first]
        # Fill up with per-word hits, ranked by how many query words hit the dataset, then downloads.
        words = [w for w in dict.fromkeys(tokenize(query)) if w not in _STOPWORDS and len(w) >= 3]
        hits: dict[str, tuple[int, DatasetInfo]] = {}
        if len(words) > 1:
            for word in words[:_MAX_WORD_SEARCHES]:
                for info in listing(word):
                    count, _ = hits.get(info.id, (0, info))
                    hits[info.id] = (count + 1, info)
        seen = {i.id for i in first}
        rest = sorted((pair for key, pair in hits.items() if key not in seen),
                      key=lambda pair: (-pair[0], -(pair[1].downloads or 0)))
        return [card_from_info(i) for i in first + [info for _, info in rest]][:limit]

    def _config(self, dataset_id: str) -> str | None:
        """The config to load: None when the dataset has a default one, else its first config."""
        import datasets

        names = datasets.get_dataset_config_names(dataset_id, token=self.token)
        return names[0] if len(names) > 1 and "default" not in names else None

    def describe(self, dataset_id: str, n_rows: int = 3) -> DatasetDetails:
        import datasets

        self._require_online("describe")
        with _not_found_as(dataset_id):
            card = card_from_info(self._api().dataset_info(dataset_id))
            config = self._config(dataset_id)
            builder = datasets.load_dataset_builder(dataset_id, config, token=self.token)
            splits = {name: split.num_examples for name, split in (builder.info.splits or {}).items()}
            split = "train" if "train" in splits or not splits else next(iter(splits))
            # Streaming reads only the first rows instead of downloading the whole dataset.
            stream = datasets.load_dataset(dataset_id, config, split=split, streaming=True, token=self.token)
            rows = [json_safe(row) for row in stream.take(n_rows)] if n_rows else []
            features = builder.info.features or stream.features
        if config:
            card.card_data["config"] = config
        return DatasetDetails(**card.model_dump(), features=feature_dtypes(features) if features else {},
                              splits=splits, example_rows=rows, is_local=False)

    def materialize(self, dataset_id: str, dest: Path) -> Path:
        """Download and save with save_to_disk; a dataset without a test split gets a seeded 80/20 one."""
        import datasets

        with _not_found_as(dataset_id), quiet_datasets():
            parts = datasets.load_dataset(dataset_id, self._config(dataset_id), token=self.token)
            if "test" not in parts and "train" in parts:
                parts = datasets.DatasetDict({**parts, **split_train_test(parts["train"])})
            with atomic.directory(dest) as tmp:
                parts.save_to_disk(str(tmp))
        return Path(dest)
