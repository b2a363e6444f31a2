"""A local stand-in for the Hugging Face Hub, serving real datasets bundled with PyPI packages.

The hub directory is built once on first use: one `save_to_disk` folder per dataset, then `index.json`
(written last, atomically) holding every card. Later processes only read the index.
"""

from __future__ import annotations

import difflib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock
from pydantic import BaseModel, ValidationError

from gymforge.core import atomic
from gymforge.offline import catalog
from gymforge.hub.base import DatasetCard, DatasetDetails, DatasetNotFound
from gymforge.hub.data import _STOPWORDS, feature_dtypes, quiet_datasets, split_train_test, tokenize

if TYPE_CHECKING:
    pass

INDEX_NAME = "index.json"

# Search weights: a query word in the id counts more than in the tags, which count more than the prose.
W_ID, W_TAGS, W_DESCRIPTION = 3, 2, 1
class IndexedDataset(BaseModel):
    card: DatasetCard
    features: dict[str, str]
    num_rows: int
    path: str  # relative to the hub root


class HubIndex(BaseModel):
    fingerprint: str
    datasets: list[IndexedDataset]


def _matches(word: str, tokens: frozenset[str]) -> bool:
    # Prefix matching lets `regress` find `regression`; short words must match exactly.
    return word in tokens or (len(word) >= 4 and any(t.startswith(word) for t in tokens))


def _card(entry: catalog.CatalogEntry, num_rows: int) -> DatasetCard:
    package = entry.source.split(".")[0]
    card_data: dict[str, Any] = {
        "task_categories": catalog.TASK_CATEGORIES[entry.task],
        "target": entry.target,
        "source": entry.source,
        "package": {"sklearn": "scikit-learn"}.get(package, package),
        "size_categories": ["n<1K" if num_rows < 1000 else "1K<n<10K" if num_rows < 10_000 else "10K<n<100K"],
        "split": {"classification": "stratified random 80/20", "regression": "random 80/20",
                  "time-series": "chronological 80/20 (test = last 20%)"}[entry.task],
    }
    if entry.time_column:
        card_data["time_column"] = entry.time_column
    return DatasetCard(id=entry.id, description=entry.description, tags=list(entry.tags), downloads=entry.downloads,
                       license=entry.license, card_data=card_data)


class _SearchDoc:
    def __init__(self, card: DatasetCard):
        self.card = card
        self.fields = (
            (W_ID, frozenset(tokenize(card.id))),
            (W_TAGS, frozenset(t for tag in card.tags for t in tokenize(tag))),
            (W_DESCRIPTION, frozenset(tokenize(card.description))),
        )

    def score(self, words: list[str]) -> tuple[int, int]:
        """(query words matched, weighted score); each word counts in its best-weighted field."""
        matched = total = 0
        for word in words:
            best = max((w for w, tokens in self.fields if _matches(word, tokens)), default=0)
            matched += best > 0
            total += best
        return matched, total


class OfflineHub:
    """Datasets from scikit-learn, statsmodels, palmerpenguins and vega_datasets, shaped like hub datasets."""

    name = "offline"

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._index: HubIndex | None = None

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    def ensure_built(self) -> HubIndex:
        """Read the index, building the hub first if it is missing or from an older catalog."""
        if self._index is None:
            self._index = self._read_index()
        if self._index is None:
            self.root.mkdir(parents=True, exist_ok=True)
            # Parallel jobs wait here; the loser of the race finds the winner's index and skips the build.
            with FileLock(str(self.root / ".build.lock")):
                self._index = self._read_index() or self._build()
        return self._index

    def _read_index(self) -> HubIndex | None:
        try:
            index = HubIndex.model_validate_json(self.index_path.read_bytes())
        except (FileNotFoundError, ValidationError):
            return None
        return index if index.fingerprint == catalog.fingerprint() else None

    def _build(self) -> HubIndex:
        import datasets

        items = []
        with quiet_datasets():
            for entry in catalog.CATALOG:
                ds = datasets.Dataset.from_pandas(catalog.load_frame(entry), preserve_index=False)
                with atomic.directory(self.root / entry.dirname) as tmp:
                    ds.save_to_disk(str(tmp))
                items.append(IndexedDataset(card=_card(entry, len(ds)), features=feature_dtypes(ds.features),
                                            num_rows=len(ds), path=entry.dirname))
        index = HubIndex(fingerprint=catalog.fingerprint(), datasets=items)
        atomic.write_text(self.index_path, index.model_dump_json(indent=1))
        return index

    @cached_property
    def _items(self) -> dict[str, IndexedDataset]:
        return {item.card.id: item for item in self.ensure_built().datasets}

    @cached_property
    def _docs(self) -> list[_SearchDoc]:
        return [_SearchDoc(item.card) for item in self._items.values()]

    def _lookup(self, dataset_id: str) -> IndexedDataset:
        wanted = dataset_id.strip()
        for item_id, item in self._items.items():
            if item_id.lower() == wanted.lower():
                return item
        close = difflib.get_close_matches(wanted, list(self._items), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise DatasetNotFound(
            f"dataset {dataset_id!r} is not on the offline hub ({len(self._items)} datasets).{hint} "
            "Use search() to find ids."
        )

    def search(self, query: str, limit: int = 10) -> list[DatasetCard]:
        exact = query.strip().lower()
        words = list(dict.fromkeys(w for w in tokenize(query) if w not in _STOPWORDS))
        ranked = []
        for doc in self._docs:
            is_exact = doc.card.id.lower() == exact
            matched, score = doc.score(words)
            if is_exact or matched:
                ranked.append(((not is_exact, matched < len(words), -score, -doc.card.downloads, doc.card.id), doc.card))
        ranked.sort(key=lambda pair: pair[0])
        return [card.model_copy(deep=True) for _, card in ranked[:limit]]

    def describe(self, dataset_id: str, n_rows: int = 3) -> DatasetDetails:
        import datasets

        item = self._lookup(dataset_id)
        ds = datasets.load_from_disk(str(self.root / item.path))
        rows = ds.select(range(min(n_rows, len(ds)))).to_list()
        return DatasetDetails(**item.card.model_dump(), features=dict(item.features),
                              splits={"train": item.num_rows}, example_rows=rows, is_local=True)

    def materialize(self, dataset_id: str, dest: Path) -> Path:
        import datasets

        item = self._lookup(dataset_id)
        entry = catalog.BY_ID[item.card.id]
        ds = datasets.load_from_disk(str(self.root / item.path))
        parts = split_train_test(ds, chronological=entry.task == "time-series",
                                 stratify_by=entry.target if entry.task == "classification" else None)
        with quiet_datasets(), atomic.directory(dest) as tmp:
            parts.save_to_disk(str(tmp))
        return Path(dest)
