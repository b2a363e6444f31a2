"""The score table (rule score_table, `gymforge.stages.scores`): it names the suite it scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymforge.core.config import GymforgeConfig
from gymforge.stages.scores import score_table

# A Harbor task folder (docs/interop.md): task.toml, instruction.md, environment/, tests/test.sh.
HARBOR = {
    "task.toml": 'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n',
    "instruction.md": "Write `Hello, world!` to /app/hello.txt.\n",
    "environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /app\n",
    "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
}


def _harbor_folder(folder: Path) -> Path:
    for rel, text in HARBOR.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def _table(tmp_path: Path, evaluate: dict) -> tuple[str, dict]:
    cfg = GymforgeConfig.model_validate({
        "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"),
        "evaluate": {"runs_per_task": 1, "models": [{"name": "teacher", "source": "teacher"}], **evaluate}})
    text = score_table(cfg, [], aup_out=tmp_path / "aup.csv", scores_out=tmp_path / "scores.json",
                       replies_out=tmp_path / "replies.json", violins_out=tmp_path / "violins.png",
                       bars_out=tmp_path / "bars.png", profiles_out=tmp_path / "profiles.png")
    return text, json.loads((tmp_path / "scores.json").read_text())


@pytest.mark.parametrize(("evaluate", "suite", "task_ids", "head"), [
    ({"benchmark": "builtin", "tasks": ["blobClustering"]}, "builtin", ["blobClustering"],
     "builtin benchmark: 1 task (blobClustering)"),
    ({"benchmark": "posttraining", "tasks": ["dateIsoPosttrain"]}, "posttraining", ["dateIsoPosttrain"],
     "posttraining benchmark: 1 task (dateIsoPosttrain)"),
    # evaluate.benchmark keeps its default (builtin), but only the Harbor folder is scored
    ({"harbor": ["{hello}"], "tasks": ["hello-world"]}, "harbor", ["hello-world"],
     "harbor benchmark: 1 task (hello-world)"),
    ({"harbor": ["{hello}"], "tasks": ["blobClustering", "hello-world"]}, "builtin + harbor",
     ["blobClustering", "hello-world"], "builtin + harbor benchmark: 2 tasks (blobClustering, hello-world)"),
])
def test_the_score_table_names_the_suite_it_scored(tmp_path: Path, evaluate: dict, suite: str,
                                                  task_ids: list[str], head: str) -> None:
    """The table's first line names the suite and counts its tasks: "1 task", "2 tasks"."""
    hello = _harbor_folder(tmp_path / "hello-world")
    evaluate = {k: [str(hello) if v == "{hello}" else v for v in val] if k == "harbor" else val
                for k, val in evaluate.items()}
    text, scores = _table(tmp_path, evaluate)
    assert text.splitlines()[0] == head
    assert (scores["benchmark"], scores["benchmark_tasks"]) == (suite, task_ids)
