"""Fetch hub datasets into the host-side dataset cache (`gymforge.tasks.datacache`: its layout, and how sandboxes
see it), one Snakemake target (rule `fetch_dataset`) per id.

The offline hub's datasets go through the same builder (`datasets`' Parquet builder under the dataset's id),
so the rule, the mounts and the tests run without a network.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.hub import DatasetHub, DatasetNotFound, HubUnavailable, HuggingFaceHub, get_hub
from gymforge.hub.data import quiet_datasets
from gymforge.sandbox import make_readable
from gymforge.student.fetch import MANIFEST as MODEL_MANIFEST
from gymforge.student.fetch import prefetch_model as fetch_model
from gymforge.tasks.datacache import MANIFEST, PREPARED, Manifest, dataset_key, entry_dir, prepared_name


class PrefetchError(RuntimeError):
    """A dataset could not be fetched into the cache; nothing was left behind."""


# -- fetching -----------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    import datasets
    import huggingface_hub
    import pyarrow

    return {"datasets": datasets.__version__, "huggingface_hub": huggingface_hub.__version__,
            "pyarrow": pyarrow.__version__}


def _prepare_from_hub(hub: HuggingFaceHub, dataset_id: str, cache_dir: Path) -> str | None:
    """What `load_dataset(id)` does online, stopped after the prepare step; returns the config."""
    import datasets

    config = hub._config(dataset_id)
    builder = datasets.load_dataset_builder(dataset_id, config, cache_dir=str(cache_dir), token=hub.token)
    builder.download_and_prepare()
    return config


def _prepare_offline(hub: DatasetHub, dataset_id: str, cache_dir: Path, work: Path) -> None:
    """The offline hub's copy (train/test split as tasks get it) as Parquet files, prepared by `datasets`'
    Parquet builder under the dataset's id: the layout a hub dataset made of Parquet files gets."""
    import datasets
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet

    parts = datasets.load_from_disk(str(hub.materialize(dataset_id, work / "saved")))
    files = {}
    for split, ds in parts.items():
        path = work / "data" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(path))
        files[split] = [str(path)]
    # Local files cannot carry a hub repo_id, so the builder prepares under the bare name, which then moves
    # to the `owner___name` directory that the hub's builder would have written.
    builder = Parquet(cache_dir=str(cache_dir), dataset_name=dataset_id.split("/")[-1], config_name="default",
                      config_id="default", hash=next(iter(parts.values()))._fingerprint,
                      data_files=DataFilesDict.from_local_or_remote(files))
    builder.download_and_prepare()
    os.rename(cache_dir / builder.dataset_name, cache_dir / prepared_name(dataset_id))


def fetch_hub(cfg: GymforgeConfig, dataset_id: str) -> DatasetHub:
    """The hub an id is fetched from: the configured one, except that ids the offline hub does not hold
    (MLGym-Bench's datasets) can only come from the real hub."""
    hub = get_hub(cfg)
    if cfg.datasets.hub == "offline":
        try:
            hub.describe(dataset_id, n_rows=0)
        except DatasetNotFound:
            return HuggingFaceHub()
    return hub


def prefetch(hub: DatasetHub, dataset_id: str, root: Path | str) -> Manifest:
    """Fetch `dataset_id` into `<root>/<key>/` (replacing an older copy) and return its manifest.

    The entry is built under a temporary name and renamed into place with its manifest, so a failure or a
    kill leaves no entry (and an existing one untouched). A per-key lock serializes fetches of one id (two
    workflows may share a cache), and under it what a killed fetch left behind is removed.
    """
    dest = entry_dir(root, dataset_id)
    dest.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # here, not at the top: the Snakefile imports this module at parse time

    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        for stale in dest.parent.glob(f".{dest.name}.*.tmp"):  # atomic.directory's temporary names
            shutil.rmtree(stale, ignore_errors=True)
        return _prefetch(hub, dataset_id, dest)


def _prefetch(hub: DatasetHub, dataset_id: str, dest: Path) -> Manifest:
    import datasets
    from datasets.packaged_modules.cache.cache import Cache

    with quiet_datasets(), atomic.directory(dest) as tmp:
        prepared = tmp / PREPARED
        if hub.name == "offline":  # a local copy, prepared as the hub would have
            config = None
            _prepare_offline(hub, dataset_id, prepared, tmp / "work")
        else:
            config = _prepare_from_hub(hub, dataset_id, prepared)
        # Read back with the builder an offline `load_dataset(id)` uses, so a cache it cannot read never lands.
        reader = Cache(cache_dir=str(prepared), repo_id=dataset_id, dataset_name=dataset_id.split("/")[-1],
                       version="auto", hash="auto", **({"config_name": config} if config else {}))
        parts = reader.as_dataset()
        if not isinstance(parts, datasets.DatasetDict):
            raise PrefetchError(f"{dataset_id}: the prepared cache holds no splits")
        splits = {name: len(ds) for name, ds in parts.items()}
        del reader, parts  # release the memory-mapped files before the move
        # Keep only the prepared dataset: builder locks (named after the temporary path) and scratch go.
        keep = prepared / prepared_name(dataset_id)
        for p in [*tmp.iterdir(), *prepared.iterdir(), *keep.rglob("*.lock")]:
            if p.is_dir() and p not in (prepared, keep):
                shutil.rmtree(p)
            elif p.is_file():
                p.unlink()
        size = sum(f.stat().st_size for f in prepared.rglob("*") if f.is_file())
        manifest = Manifest(
            id=dataset_id, key=dataset_key(dataset_id), hub=hub.name, config=config, splits=splits,
            rows=sum(splits.values()), bytes=size, path=f"{PREPARED}/{prepared_name(dataset_id)}",
            fetched_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), versions=_versions(),
        )
        atomic.write_text(tmp / MANIFEST, manifest.model_dump_json(indent=2) + "\n")
        make_readable(tmp)
    return manifest


def fetch_dataset(cfg: GymforgeConfig, dataset_id: str, out: Path) -> str:
    """Fetch one hub dataset into the host cache that sandboxes mount read-only; `out` is its manifest."""
    out = Path(out)
    if out.name != MANIFEST or out.parent.name != dataset_key(dataset_id):
        raise SystemExit(f"gymforge: --out must be <cache root>/{dataset_key(dataset_id)}/{MANIFEST}, got {out}")
    try:
        m = prefetch(fetch_hub(cfg, dataset_id), dataset_id, out.parent.parent)
    except (DatasetNotFound, HubUnavailable, PrefetchError) as err:
        raise SystemExit(f"gymforge: {err}") from err
    return f"{m.id}: {m.hub} hub, config {m.config or 'default'}, splits {m.splits}, {m.bytes} bytes -> {out.parent}"


# -- models ---------------------------------------------------------------------------------------------


def prefetch_model(model: str, out: Path) -> str:
    """Fetch one hub model (the student's base) into the model cache that jobs load it from (rule
    `prefetch_model`, run where Snakemake runs: it needs the internet, the jobs then do not)."""
    folder = fetch_model(model, Path(out))
    info = json.loads((folder / MODEL_MANIFEST).read_text())
    return f"{model}@{info['revision']}: {len(info['files'])} files, {info['bytes'] / 1e6:.1f} MB in {folder}"
