"""The dataset hub seam: the offline hub built from bundled real datasets, and the Hugging Face backend."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import datasets
import pytest
from huggingface_hub.hf_api import DatasetInfo

from gymforge.core.config import GymforgeConfig
from gymforge.hub import DatasetNotFound, HubUnavailable, HuggingFaceHub, get_hub
from gymforge.offline import catalog
from gymforge.offline.hub import OfflineHub
from gymforge.hub.huggingface import card_from_info, json_safe
from gymforge.hub.data import feature_dtypes


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> GymforgeConfig:
    return GymforgeConfig(cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def hub(cfg: GymforgeConfig) -> OfflineHub:
    built = get_hub(cfg)
    assert isinstance(built, OfflineHub)
    built.ensure_built()
    return built


def _stored(hub: OfflineHub, dataset_id: str) -> datasets.Dataset:
    return datasets.load_from_disk(str(hub.root / catalog.BY_ID[dataset_id].dirname))


# --- building ---

def test_builds_real_datasets_of_every_kind(hub: OfflineHub) -> None:
    index = hub.ensure_built()
    assert len(index.datasets) >= 14
    kinds = set()
    for item in index.datasets:
        ds = datasets.load_from_disk(str(hub.root / item.path))
        assert len(ds) == item.num_rows > 0
        assert feature_dtypes(ds.features) == item.features
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", col) for col in ds.column_names), item.card.id
        data = item.card.card_data
        assert data["target"] in ds.column_names and data["source"] and data["task_categories"]
        assert item.card.description and item.card.tags and item.card.license and item.card.downloads > 0
        kinds.update(data["task_categories"])
    assert {"tabular-classification", "tabular-regression", "time-series-forecasting"} <= kinds


def test_stored_rows_are_the_packages_rows(hub: OfflineHub) -> None:
    from palmerpenguins import load_penguins
    from sklearn.datasets import load_diabetes, load_iris

    iris = _stored(hub, "sklearn/iris")
    assert iris["sepal_length_cm"] == load_iris().data[:, 0].tolist()
    assert sorted(set(iris["species"])) == ["setosa", "versicolor", "virginica"]
    assert _stored(hub, "sklearn/diabetes")["progression"] == load_diabetes().target.tolist()
    penguins = _stored(hub, "palmerpenguins/penguins")
    assert len(penguins) == len(load_penguins()) == 344
    assert penguins["species"] == load_penguins()["species"].tolist()


def test_get_hub_reads_the_index_without_rebuilding(hub: OfflineHub, cfg: GymforgeConfig,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    before = hub.index_path.stat().st_mtime_ns
    monkeypatch.setattr(OfflineHub, "_build", lambda self: pytest.fail("rebuilt an existing hub"))
    again = get_hub(cfg)
    assert again.search("iris")[0].id == "sklearn/iris"
    assert hub.index_path.stat().st_mtime_ns == before


def test_parallel_first_use_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A two-dataset catalog keeps this fast; its fingerprint differs, so nothing is shared with `hub`.
    monkeypatch.setattr(catalog, "CATALOG", catalog.CATALOG[:2])
    builds = []
    real_build = OfflineHub._build

    def counted(self: OfflineHub):
        builds.append(1)
        time.sleep(0.2)  # widen the race window
        return real_build(self)

    monkeypatch.setattr(OfflineHub, "_build", counted)
    results = []
    threads = [threading.Thread(target=lambda: results.append(OfflineHub(tmp_path).ensure_built())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert [len(r.datasets) for r in results] == [2, 2, 2]


def test_catalog_change_triggers_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "CATALOG", catalog.CATALOG[:1])
    OfflineHub(tmp_path).ensure_built()
    monkeypatch.setattr(catalog, "CATALOG", catalog.CATALOG[:1] + (catalog.BY_ID["statsmodels/nile"],))
    assert [i.card.id for i in OfflineHub(tmp_path).ensure_built().datasets] == ["sklearn/iris", "statsmodels/nile"]


# --- search ---

@pytest.mark.parametrize(("query", "top"), [
    ("penguin species", "palmerpenguins/penguins"),
    ("Penguins!", "palmerpenguins/penguins"),
    ("diabetes progression regression", "sklearn/diabetes"),
    ("breast cancer diagnosis", "sklearn/breast_cancer"),
    ("handwritten digits", "sklearn/digits"),
    ("sunspot forecasting", "statsmodels/sunspots"),
    ("statsmodels/nile", "statsmodels/nile"),
    ("SKLEARN/Wine", "sklearn/wine"),
])
def test_search_top_hit(hub: OfflineHub, query: str, top: str) -> None:
    assert hub.search(query)[0].id == top


def test_search_ranks_full_matches_first_then_weight_then_downloads(hub: OfflineHub) -> None:
    hits = hub.search("classification medical", limit=30)
    assert hits[0].id == "sklearn/breast_cancer"  # the only one with both words in its tags
    rest = hits[1:]
    assert rest and all(not {"classification", "medical"} <= set(h.tags) for h in rest)
    # A tag hit outweighs a description-only hit; equal weights fall back to downloads.
    keys = [(-(2 if {"classification", "medical"} & set(h.tags) else 1), -h.downloads) for h in rest]
    assert keys == sorted(keys) and keys[-1][0] == -1


def test_search_limit_and_no_match(hub: OfflineHub) -> None:
    assert len(hub.search("regression", limit=3)) == 3
    assert hub.search("xyzzy qwertyuiop") == []
    assert hub.search("the data") == []  # stop words alone match nothing


# --- describe ---

def test_describe_matches_the_stored_data(hub: OfflineHub) -> None:
    details = hub.describe("palmerpenguins/penguins", n_rows=5)
    stored = _stored(hub, "palmerpenguins/penguins")
    assert details.is_local and details.splits == {"train": 344}
    assert details.features == feature_dtypes(stored.features)
    assert details.features["species"] == "string" and details.features["body_mass_g"] == "float64"
    assert details.example_rows == stored.select(range(5)).to_list()
    json.dumps(details.example_rows, allow_nan=False)  # row 4 has missing values
    assert details.card_data["target"] == "species"


def test_describe_unknown_id(hub: OfflineHub) -> None:
    with pytest.raises(DatasetNotFound, match="sklearn/iris"):
        hub.describe("sklearn/irs")


# --- materialize ---

def test_materialize_is_a_deterministic_stratified_80_20_split(hub: OfflineHub, tmp_path: Path) -> None:
    first = datasets.load_from_disk(str(hub.materialize("sklearn/iris", tmp_path / "a")))
    second = datasets.load_from_disk(str(hub.materialize("sklearn/iris", tmp_path / "b")))
    assert (len(first["train"]), len(first["test"])) == (120, 30)
    assert first["train"].to_list() == second["train"].to_list()
    assert first["test"].to_list() == second["test"].to_list()
    assert sorted(first["test"]["species"]) == ["setosa"] * 10 + ["versicolor"] * 10 + ["virginica"] * 10
    rows = first["train"].to_list() + first["test"].to_list()
    assert sorted(map(str, rows)) == sorted(map(str, _stored(hub, "sklearn/iris").to_list()))


def test_materialize_replaces_existing_dest(hub: OfflineHub, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    hub.materialize("statsmodels/engel", dest)
    assert hub.materialize("statsmodels/engel", dest) == dest
    assert set(datasets.load_from_disk(str(dest))) == {"train", "test"}
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temp dirs left behind


def test_time_series_test_split_is_the_chronological_tail(hub: OfflineHub, tmp_path: Path) -> None:
    parts = datasets.load_from_disk(str(hub.materialize("statsmodels/sunspots", tmp_path / "s")))
    stored = _stored(hub, "statsmodels/sunspots")
    n_test = len(parts["test"])
    assert n_test == 62 and len(parts["train"]) == 247
    assert parts["test"].to_list() == stored.select(range(len(stored) - n_test, len(stored))).to_list()
    assert max(parts["train"]["year"]) < min(parts["test"]["year"]) and parts["test"]["year"][-1] == 2008


# --- Hugging Face backend ---

def test_get_hub_huggingface(cfg: GymforgeConfig) -> None:
    hf_cfg = cfg.model_copy(update={"datasets": cfg.datasets.model_copy(update={"hub": "huggingface"})})
    assert get_hub(hf_cfg).name == "huggingface"


def test_card_from_api_dataset_info() -> None:
    # Shaped like one item of GET /api/datasets?full=true.
    info = DatasetInfo(
        id="scikit-learn/iris", author="scikit-learn", downloads=4321, likes=12,
        tags=["task_categories:tabular-classification", "license:cc0-1.0", "size_categories:n<1K"],
        cardData={"pretty_name": "Iris", "configs": [{"config_name": "default", "data_files": "Iris.csv"}]},
        description="Iris flower measurements for three species.",
    )
    card = card_from_info(info)
    assert (card.id, card.downloads, card.likes, card.license) == ("scikit-learn/iris", 4321, 12, "cc0-1.0")
    assert card.description == "Iris flower measurements for three species."
    assert card.card_data == {"pretty_name": "Iris", "task_categories": ["tabular-classification"]}


def test_card_from_sparse_dataset_info() -> None:
    card = card_from_info(DatasetInfo(id="someone/thing", cardData={"license": ["mit", "apache-2.0"],
                                                                   "pretty_name": "Thing"}))
    assert (card.description, card.license, card.downloads, card.tags) == ("Thing", "mit", 0, [])


def test_json_safe_rows() -> None:
    row = {"text": "x" * 600, "score": float("nan"), "img": b"\x00" * 9, "ids": list(range(25)), "obj": object()}
    safe = json_safe(row)
    json.dumps(safe, allow_nan=False)
    assert len(safe["text"]) == 503 and safe["score"] is None and safe["img"] == "<9 bytes>"
    assert safe["ids"][-1] == "..." and safe["obj"] == "<object>"


@pytest.mark.parametrize("call", [lambda h: h.search("iris"), lambda h: h.describe("scikit-learn/iris")])
def test_huggingface_fails_fast_offline(call) -> None:
    start = time.monotonic()
    with pytest.raises(HubUnavailable, match="HF_HUB_OFFLINE"):
        call(HuggingFaceHub())
    assert time.monotonic() - start < 2


def test_huggingface_materialize_adds_a_test_split(tmp_path: Path) -> None:
    # A local folder exercises the same load_dataset + save_to_disk path without a network.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.csv").write_text("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(10)))
    out = HuggingFaceHub().materialize(str(tmp_path / "src"), tmp_path / "out")
    parts = datasets.load_from_disk(str(out))
    assert (len(parts["train"]), len(parts["test"])) == (8, 2)
