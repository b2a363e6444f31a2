"""The host-side dataset cache: hub datasets that tasks load by id, fetched once and mounted read-only.

Task code written against the real hub calls `datasets.load_dataset("<owner>/<name>")`, but sandboxes have
no network. So each dataset id is fetched once on the host (Snakemake rule `fetch_dataset`, one target per
id) into `<cache root>/<key>/`:

    manifest.json                                   id, config, splits, rows, bytes, when, library versions
    datasets/<owner>___<name>/<config>/<version>/<hash>/   the prepared Arrow cache `load_dataset` writes

and every sandbox that runs such a task sees the entry read-only, with `HF_HUB_OFFLINE=1`, so that
`load_dataset(id)` resolves from it exactly as it would from a warm cache.

Why the sandbox's HF_DATASETS_CACHE is not the cache itself: `datasets` (measured with 5.2) takes a file
lock in the root of HF_DATASETS_CACHE whenever it builds a dataset builder, even to read a prepared cache,
so `load_dataset` on a read-only cache fails with `OSError: [Errno 30] Read-only file system: '...lock'`
(also when the lock files of the fetch are removed). `sandbox_view` therefore gives each sandbox a small
writable HF_HOME whose `datasets/` holds one symlink per dataset into the read-only mount: the locks land
in the writable root, the data is only ever read, and the cache stays shared and unmodifiable.

The offline hub's datasets go through the same builder (`datasets`' Parquet builder under the dataset's id),
so the rule, the mounts and the tests run without a network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gymforge.core import atomic

if TYPE_CHECKING:
    from gymforge.core.config import GymforgeConfig
    from gymforge.hub.base import DatasetHub
    from gymforge.hub.huggingface import HuggingFaceHub
    from gymforge.sandbox import Mount

MANIFEST = "manifest.json"
PREPARED = "datasets"  # inside an entry: the HF_DATASETS_CACHE-layout tree
_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*")
KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # Snakemake wildcard constraint of a key


class PrefetchError(RuntimeError):
    """A dataset could not be fetched into the cache; nothing was left behind."""


class Manifest(BaseModel):
    id: str
    key: str
    hub: str
    config: str | None = Field(None, description="The config that was prepared (None: the dataset's default).")
    splits: dict[str, int] = Field(description="Split name -> rows.")
    rows: int
    bytes: int = Field(description="Size of the prepared Arrow cache.")
    path: str = Field(description="The prepared dataset directory, relative to the entry.")
    fetched_at: str
    versions: dict[str, str]


def dataset_key(dataset_id: str) -> str:
    """`owner/name` -> `owner--name`: one path component, a valid wildcard, and reversible (hub ids never
    contain `--`)."""
    if not _ID.fullmatch(dataset_id) or "--" in dataset_id or ".." in dataset_id:
        raise ValueError(f"{dataset_id!r} is not a Hugging Face dataset id (owner/name)")
    return dataset_id.replace("/", "--")


def dataset_id_of(key: str) -> str:
    """The inverse of `dataset_key`."""
    dataset_id = key.replace("--", "/", 1)
    if dataset_key(dataset_id) != key:
        raise ValueError(f"{key!r} is not a dataset cache key (owner--name)")
    return dataset_id


def cache_root(cfg: GymforgeConfig) -> Path:
    """Where fetched datasets live: `datasets.cache_dir`, by default `<cache_dir>/datasets`."""
    return Path(cfg.datasets.cache_dir) if cfg.datasets.cache_dir else cfg.cache / "datasets"


def entry_dir(root: Path | str, dataset_id: str) -> Path:
    return Path(root) / dataset_key(dataset_id)


def prepared_name(dataset_id: str) -> str:
    """The directory `datasets` keeps a hub dataset's prepared cache in (`owner___name`)."""
    from datasets.naming import camelcase_to_snakecase

    *owner, name = dataset_id.split("/")
    return "___".join([*owner, camelcase_to_snakecase(name)])


def read_manifest(root: Path | str, dataset_id: str) -> Manifest:
    return Manifest.model_validate_json((entry_dir(root, dataset_id) / MANIFEST).read_text())


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
    from gymforge.hub import DatasetNotFound, HuggingFaceHub, get_hub

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

    from gymforge.hub.data import quiet_datasets
    from gymforge.sandbox import make_readable

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


# -- what tasks and sandboxes need -------------------------------------------------------------------


def proposal_dataset_ids(proposal: Path | str) -> list[str]:
    """The hub dataset a proposal resolved (none when discarded or served as a local copy)."""
    record = json.loads(Path(proposal).read_text())
    dataset = record.get("dataset") or {}
    return [dataset["id"]] if record.get("status") == "ok" and dataset.get("id") and not dataset.get("is_local") else []


def task_dataset_ids(task_yaml: Path | str, root: Path | str) -> list[str]:
    """Ids of the non-local datasets an MLGym task loads from the hub."""
    from gymforge.tasks.mlgym import load_dataset_config, load_task_config

    task = load_task_config(task_yaml)
    configs = (load_dataset_config(Path(root) / "configs" / entry) for entry in task.dataset_configs)
    return list(dict.fromkeys(d.data_path for d in configs if not d.is_local))


VIEW_HOME, VIEW_DATASETS = "/hf-home", "/hf-datasets"
"""Where a sandbox that builds its own view (bwrap, docker) shows the writable HF_HOME and the entries."""


def sandbox_view(
    root: Path | str, dataset_ids: list[str], hf_home: Path, *, fixed: bool = True
) -> tuple[list[Mount], dict[str, str]]:
    """Mounts and environment under which `load_dataset(id)` reads the fetched copies of `dataset_ids`.

    `hf_home` (a host directory, recreated here) becomes the sandbox's writable HF_HOME; each entry is
    mounted read-only, and the symlinks in `hf_home/datasets` point to it. With `fixed` (bwrap, docker)
    both appear at fixed paths (`/hf-home`, `/hf-datasets/<owner--name>`), so no host path reaches the
    sandbox; without (an unconfined local sandbox that sees the host) at their host paths.
    """
    from gymforge.sandbox import Mount

    root = Path(root).resolve()
    missing = [i for i in dataset_ids if not (entry_dir(root, i) / MANIFEST).is_file()]
    if missing:
        raise FileNotFoundError(
            f"dataset(s) {', '.join(missing)} are not in the dataset cache {root}: fetch them first "
            f"(`snakemake datasets`, or `gymforge fetch-dataset --dataset-id <id> --out "
            f"{root}/<owner--name>/{MANIFEST}`)"
        )
    hf_home = Path(hf_home).resolve()
    if hf_home.exists():
        shutil.rmtree(hf_home)
    (hf_home / PREPARED).mkdir(parents=True)
    hf_home.chmod(0o755)
    mounts = []
    home = VIEW_HOME if fixed else str(hf_home)
    for dataset_id in dict.fromkeys(dataset_ids):
        entry = entry_dir(root, dataset_id)
        manifest = read_manifest(root, dataset_id)
        shown = f"{VIEW_DATASETS}/{entry.name}" if fixed else str(entry)
        (hf_home / PREPARED / Path(manifest.path).name).symlink_to(f"{shown}/{manifest.path}")
        mounts.append(Mount(host=entry, target=shown, read_only=True))
    mounts.append(Mount(host=hf_home, target=home, read_only=False))
    env = {"HF_HOME": home, "HF_DATASETS_CACHE": f"{home}/{PREPARED}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return mounts, env


def fetch_dataset(cfg: GymforgeConfig, dataset_id: str, out: Path) -> str:
    """Fetch one hub dataset into the host cache that sandboxes mount read-only; `out` is its manifest."""
    from gymforge.hub import DatasetNotFound, HubUnavailable

    out = Path(out)
    if out.name != MANIFEST or out.parent.name != dataset_key(dataset_id):
        raise SystemExit(f"gymforge: --out must be <cache root>/{dataset_key(dataset_id)}/{MANIFEST}, got {out}")
    try:
        m = prefetch(fetch_hub(cfg, dataset_id), dataset_id, out.parent.parent)
    except (DatasetNotFound, HubUnavailable, PrefetchError) as err:
        raise SystemExit(f"gymforge: {err}") from err
    return f"{m.id}: {m.hub} hub, config {m.config or 'default'}, splits {m.splits}, {m.bytes} bytes -> {out.parent}"
