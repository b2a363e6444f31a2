"""A copy of the workflow in a scratch directory, so a test's Snakemake run has its own results and cache."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(dest: Path, *dirs: str) -> Path:
    """Snakefile and config.yaml plus the named folders of the repository (e.g. "rules", "report") in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(REPO / name, dest / name)
    for name in dirs:
        shutil.copytree(REPO / name, dest / name)
    return dest
