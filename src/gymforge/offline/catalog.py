"""The real datasets bundled with PyPI packages that the offline hub serves, and how to load each one.

The entries themselves are data (catalog.yaml, shipped with the package); each names its loader as
`<package>:<dataset>`, resolved through LOADERS here.

Every loader returns the data as its package ships it; `load_frame` only renames columns, drops rows
without a target and normalises dtypes, so no row is ever invented.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any, Callable, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field

Task = Literal["classification", "regression", "time-series"]

TASK_CATEGORIES: dict[Task, list[str]] = {
    "classification": ["tabular-classification"],
    "regression": ["tabular-regression"],
    "time-series": ["time-series-forecasting"],
}

# Bump when a loader or `load_frame` changes the stored data, so existing offline hubs rebuild.
FORMAT_VERSION = 1


class CatalogEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    task: Task
    target: str = Field(description="Label column; for time series the value column.")
    time_column: str | None = Field(None, description="Ordering column of a time series.")
    description: str
    tags: tuple[str, ...]
    downloads: int
    license: str
    source: str = Field(description="Package function the rows come from.")
    renames: dict[str, str] = Field(default_factory=dict, description="Raw column -> clean name, where snake_case is not enough.")
    loader: Callable[[], pd.DataFrame] = Field(exclude=True)

    @property
    def dirname(self) -> str:
        return self.id.replace("/", "__")


# A loader factory takes the dataset's name within its package, the entry's target column (scikit-learn calls
# its label `target`) and the entry's `loader_options`, and returns the function that reads the rows.
LoaderFactory = Callable[..., Callable[[], pd.DataFrame]]


def _sklearn(name: str, target: str, class_names: bool = False, **kwargs: object) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{name}")(as_frame=True, **kwargs)
        df = bunch.frame.rename(columns={"target": target})
        if class_names:
            df[target] = np.asarray(bunch.target_names)[bunch.target.to_numpy()]
        return df

    return load


def _statsmodels(name: str, target: str, index_name: str | None = None) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        df = importlib.import_module(f"statsmodels.datasets.{name}").load_pandas().data
        # Some sets keep a real column (date, state) in the index.
        return df.rename_axis(index_name).reset_index() if index_name else df

    return load


def _vega(name: str, target: str, dates: Sequence[str] = (), years: Sequence[str] = ()) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from vega_datasets import local_data

        # Read the bundled file directly: the package's own reader relies on a pandas option being removed.
        spec = getattr(local_data, name.replace("-", "_"))
        df = pd.read_json(spec.filepath) if spec.format == "json" else pd.read_csv(spec.filepath)
        for col in dates:
            df[col] = pd.to_datetime(df[col])
        for col in years:
            # Model years stored as "1970-01-01": the year is the information.
            df[col] = pd.to_datetime(df[col]).dt.year
        return df

    return load


def _palmerpenguins(name: str, target: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        import palmerpenguins

        return getattr(palmerpenguins, f"load_{name}")()

    return load


LOADERS: dict[str, LoaderFactory] = {
    "sklearn": _sklearn, "statsmodels": _statsmodels, "vega": _vega, "palmerpenguins": _palmerpenguins,
}


def _entry(fields: dict[str, Any]) -> CatalogEntry:
    """A catalog.yaml entry, its `loader: <package>:<dataset>` resolved through LOADERS."""
    fields = dict(fields)
    package, name = fields.pop("loader").split(":", 1)
    loader = LOADERS[package](name, fields["target"], **fields.pop("loader_options", {}))
    return CatalogEntry(**fields, loader=loader)


def _read_catalog() -> tuple[CatalogEntry, ...]:
    text = resources.files(__package__).joinpath("catalog.yaml").read_text(encoding="utf-8")
    return tuple(_entry(fields) for fields in yaml.safe_load(text))


# Tabular classification, tabular regression and time series, in that order (catalog.yaml).
CATALOG: tuple[CatalogEntry, ...] = _read_catalog()
BY_ID: dict[str, CatalogEntry] = {e.id: e for e in CATALOG}


def fingerprint() -> str:
    """Changes whenever the catalog or the loading code's output format changes."""
    payload = {"format": FORMAT_VERSION, "entries": [e.model_dump(mode="json") for e in CATALOG]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def snake_case(name: str) -> str:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def load_frame(entry: CatalogEntry) -> pd.DataFrame:
    """The entry's rows with clean column names and `datasets`-friendly dtypes; only target-less rows dropped."""
    df = entry.loader().rename(columns=entry.renames)
    df.columns = [snake_case(str(c)) for c in df.columns]
    if df.columns.duplicated().any():
        raise ValueError(f"{entry.id}: duplicate column names after cleaning: {list(df.columns)}")
    missing = {entry.target, entry.time_column} - set(df.columns) - {None}
    if missing:
        raise ValueError(f"{entry.id}: columns {sorted(missing)} not in {list(df.columns)}")
    df = df.dropna(how="all").dropna(subset=[entry.target])
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_datetime64_any_dtype(s):
            # ISO strings survive every consumer (JSON, Arrow, pandas) without timezone surprises.
            s = s.dt.strftime("%Y-%m-%d" if (s.dt.normalize() == s).all() else "%Y-%m-%dT%H:%M:%S")
        if pd.api.types.is_float_dtype(s) and s.notna().all() and (s == s.round()).all():
            s = s.astype("int64")  # codes and years the packages store as floats
        elif pd.api.types.is_integer_dtype(s):
            s = s.astype("int64")
        elif isinstance(s.dtype, pd.StringDtype) or pd.api.types.is_object_dtype(s):
            s = s.astype(object)  # becomes plain Arrow `string`, not `large_string`
        df[col] = s
    if entry.time_column:
        df = df.sort_values(entry.time_column, kind="stable")
    return df.reset_index(drop=True)
