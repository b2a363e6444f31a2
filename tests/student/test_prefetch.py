"""Prefetch, then offline jobs (gymforge.student.fetch, rules prefetch_model / prefetch): a hub student is fetched
once where Snakemake runs, and the jobs that load it run with the hub unreachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_hf_hub import FakeHFHub
from workflow_copy import copy_workflow

from gymforge.core.config import validate_config
from gymforge.core.prompts import templates_dir
from gymforge.student.base import base_of, build_base
from gymforge.student.fetch import MANIFEST, prefetched, require_offline_copy
from gymforge.student.tokenizer import build_tokenizer

MODEL = "acme/tiny-qwen3"


def test_a_hub_student_is_loaded_from_its_prefetched_folder() -> None:
    cfg = validate_config({"train": {"student": MODEL}})
    assert base_of(cfg) == str(cfg.cache / "models" / "acme--tiny-qwen3") == str(prefetched(cfg, MODEL))
    assert base_of(validate_config({"train": {"student": MODEL, "prefetch": False}})) == MODEL
    assert prefetched(cfg, "offline") is None and prefetched(cfg, "/models/mine") is None


def test_a_job_without_the_prefetched_model_names_the_step_that_fetches_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run `snakemake prefetch` on a node with internet"):
        require_offline_copy(tmp_path / "acme--tiny-qwen3", MODEL)


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a real (tiny, random) Qwen3 with its tokenizer, as a hub repository holds them."""
    root = tmp_path_factory.mktemp("repo")
    tokenizer = build_tokenizer("offline", root / "tokenizer", templates_dir(), [])
    base = build_base(validate_config({}), tokenizer, root / "base")
    return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}


def _snakemake(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args, "--configfile", "prefetch.yaml"],
                          cwd=workdir, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # two snakemake runs: ~30 s
def test_prefetch_then_the_jobs_run_with_the_hub_offline(model_repo: dict[str, bytes], tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf", "rules", "report")
    (workdir / "prefetch.yaml").write_text(yaml.safe_dump({"base": "config.yaml", "train": {"student": MODEL}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HF_HOME"] = str(tmp_path / "hf-home")

    with FakeHFHub({MODEL: model_repo}) as hub:
        proc = _snakemake(workdir, {**env, "HF_ENDPOINT": hub.url}, "prefetch")
        assert proc.returncode == 0, proc.stderr[-4000:]
        # every request of the download was answered (huggingface_hub also asks for its agent registry: not ours)
        assert not [u for u in hub.unhandled if "/api/agent-harnesses" not in u], hub.unhandled
    folder = workdir / ".cache" / "gymforge" / "models" / "acme--tiny-qwen3"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["id"] == MODEL and "model.safetensors" in manifest["files"]
    assert (folder / "model.safetensors").read_bytes() == model_repo["model.safetensors"]

    # The hub is gone (and declared offline): the tokenizer job loads the prefetched folder.
    offline = {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    proc = _snakemake(workdir, offline, "results/student/tokenizer")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (workdir / "results" / "student" / "tokenizer" / "tokenizer.json").exists()
    # SFT is planned from that folder too, not from the hub id.
    proc = _snakemake(workdir, offline, "-n", "-p", "--forcerun", "train_student", "results/checkpoints/tiny-qwen3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--base .cache/gymforge/models/acme--tiny-qwen3" in proc.stdout
