"""Data helpers every hub backend shares: search tokens, feature dtypes, the deterministic train/test split."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import datasets

SEED = 42
TEST_FRACTION = 0.2
_STOPWORDS = frozenset("a an and the of for to in on with by from or about dataset datasets data".split())


def normalize_token(token: str) -> str:
    """Fold simple plurals so `penguins`/`penguin` and `classes`/`class` meet."""
    if len(token) <= 3:
        return token
    if token.endswith("ies"):
        return token[:-3] + "y"
    if token.endswith(("sses", "xes", "ches", "shes")):
        return token[:-2]
    if token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    return [normalize_token(t) for t in re.findall(r"[a-z0-9]+", text.lower())]


def feature_dtypes(features: datasets.Features) -> dict[str, str]:
    """Column -> dtype string: the Arrow dtype for plain values, the feature's repr otherwise."""
    import datasets

    def dtype(feature: Any) -> str:
        if isinstance(feature, datasets.Value):
            return "string" if feature.dtype == "large_string" else feature.dtype
        if isinstance(feature, datasets.ClassLabel):
            return f"class_label({', '.join(feature.names)})"
        return repr(feature)

    return {name: dtype(f) for name, f in features.items()}


def split_train_test(ds: datasets.Dataset, *, chronological: bool = False, stratify_by: str | None = None,
                     seed: int = SEED) -> datasets.DatasetDict:
    """Deterministic 80/20 split; time series keep their last 20% as test, rows stay in original order."""
    import datasets
    import numpy as np
    import pandas as pd

    n = len(ds)
    n_test = min(max(math.ceil(n * TEST_FRACTION), 1), n - 1)
    if chronological:
        test = np.arange(n - n_test, n)
    else:
        order = np.random.default_rng(seed).permutation(n)
        if stratify_by:
            # Spread each class evenly over the shuffled order (rank within class / class size),
            # so the first n_test rows hold every class in proportion and the test size stays exact.
            labels = pd.Series(np.asarray(ds[stratify_by], dtype=object)[order])
            key = (labels.groupby(labels).cumcount() + 0.5) / labels.groupby(labels).transform("size")
            order = order[np.argsort(key.to_numpy(), kind="stable")]
        test = np.sort(order[:n_test])
    train = np.setdiff1d(np.arange(n), test)
    return datasets.DatasetDict({"train": ds.select(train), "test": ds.select(test)})


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """Silence `datasets` progress bars for a block, leaving the caller's setting as it was."""
    import datasets

    was_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
