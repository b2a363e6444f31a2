"""Hub models fetched once, before the jobs that load them: the student's base (`train.student` a hub id).

On a cluster whose compute nodes have no internet, rule `prefetch_model` (a local rule: it runs where Snakemake
runs, the login node) downloads the model into `<cache_dir>/models/<owner--name>/` with its tokenizer files and a
manifest; the student's tokenizer, SFT, RL and the `student-base` benchmark runs then load that folder, with the hub
offline. `snakemake prefetch` fetches every model and benchmark dataset the plan needs in one go.

`train.prefetch: false` keeps loading the id in each job (from the hub or the job's own Hugging Face cache).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig

MANIFEST = "gymforge_model.json"
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# The files a causal LM and its tokenizer need; everything else in a repository (other formats, images) is skipped.
FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]


def is_hub_id(model: str) -> bool:
    """`owner/name` that is not a folder here: what `from_pretrained` would download."""
    return bool(_HUB_ID.fullmatch(model)) and "--" not in model and not Path(model).exists()


def model_key(model: str) -> str:
    return model.replace("/", "--")


def models_root(cfg: GymforgeConfig) -> Path:
    return cfg.cache / "models"


def prefetched(cfg: GymforgeConfig, model: str) -> Path | None:
    """The folder `model` is loaded from when it is prefetched (`train.prefetch` and a hub id), else None."""
    if not (cfg.train.prefetch and is_hub_id(model)):
        return None
    return models_root(cfg) / model_key(model)


def hub_models(cfg: GymforgeConfig) -> list[str]:
    """The hub models the plan loads that are fetched ahead: the student's base."""
    return [m for m in (cfg.train.student,) if prefetched(cfg, m) is not None]


def prefetch_model(model: str, out: Path | str, revision: str | None = None) -> Path:
    """Download `model`'s weights, config and tokenizer files into the folder `out` (atomically) with a manifest
    (id, revision, files, bytes). Needs the hub (`HF_TOKEN` for gated models)."""
    from huggingface_hub import HfApi, snapshot_download

    info = HfApi().model_info(model, revision=revision)
    with atomic.directory(Path(out)) as tmp:
        snapshot_download(model, revision=info.sha, local_dir=str(tmp), allow_patterns=FILES)
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file() and ".cache" not in p.parts)
        if not any(f.endswith(".safetensors") for f in files):
            raise FileNotFoundError(f"{model}@{info.sha}: no *.safetensors weights in the repository")
        manifest = {"id": model, "revision": info.sha, "files": files,
                    "bytes": sum((tmp / f).stat().st_size for f in files)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        # huggingface_hub's download metadata: not part of the model
        shutil.rmtree(tmp / ".cache", ignore_errors=True)
    return Path(out)


def require_offline_copy(folder: Path | str, model: str) -> Path:
    """`folder` if it holds a prefetched model; otherwise a clear error naming the step that fetches it."""
    if not (Path(folder) / MANIFEST).is_file():
        raise FileNotFoundError(f"{model} was not prefetched into {folder}: run `snakemake prefetch` on a node with "
                                "internet (the login node) first" + (" (HF_HUB_OFFLINE is set here)"
                                                                     if os.environ.get("HF_HUB_OFFLINE") else ""))
    return Path(folder)
