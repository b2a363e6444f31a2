"""The host-side dataset cache: hub datasets that tasks load by id, fetched once (`gymforge.stages.datasets`) and
mounted read-only.

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
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gymforge.sandbox import Mount
from gymforge.tasks.mlgym import load_dataset_config, load_task_config

if TYPE_CHECKING:
    from gymforge.core.config import GymforgeConfig

MANIFEST = "manifest.json"
PREPARED = "datasets"  # inside an entry: the HF_DATASETS_CACHE-layout tree
_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*")
KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # Snakemake wildcard constraint of a key



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
    from datasets.naming import camelcase_to_snakecase  # deferred: `datasets` takes ~1 s; the Snakefile imports this

    *owner, name = dataset_id.split("/")
    return "___".join([*owner, camelcase_to_snakecase(name)])


def read_manifest(root: Path | str, dataset_id: str) -> Manifest:
    return Manifest.model_validate_json((entry_dir(root, dataset_id) / MANIFEST).read_text())


# -- what tasks and sandboxes need -------------------------------------------------------------------


def proposal_dataset_ids(proposal: Path | str) -> list[str]:
    """The hub dataset a proposal resolved (none when discarded or served as a local copy)."""
    record = json.loads(Path(proposal).read_text())
    dataset = record.get("dataset") or {}
    return [dataset["id"]] if record.get("status") == "ok" and dataset.get("id") and not dataset.get("is_local") else []


def task_dataset_ids(task_yaml: Path | str, root: Path | str) -> list[str]:
    """Ids of the non-local datasets an MLGym task loads from the hub."""
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
