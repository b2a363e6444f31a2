"""Which evaluation scripts the scorer runs under gymforge's evaluation contract (`Scoring.isolated`): those whose syntax
tree imports gymforge_eval. A script that only mentions it imports the submission itself; scored under the contract
it would see the task's own module, never the agent's, and every agent would silently score the baseline."""

from __future__ import annotations

import shutil
from pathlib import Path


from gymforge.sandbox import get_sandbox
from gymforge.tasks.environment import TaskEnvironment

REPO = Path(__file__).resolve().parents[2]
BUILTIN = REPO / "src" / "gymforge" / "benchmark" / "tasks"
def _environment(root: Path, yaml: Path, tmp_path: Path) -> TaskEnvironment:
    return TaskEnvironment(yaml, root=root, sandbox=get_sandbox("local"), run_dir=tmp_path / "run" / yaml.stem)


def test_a_task_whose_evaluator_mentions_gymforge_eval_in_a_comment_is_not_isolated(tmp_path):
    """The built-in graphColoring with its channel import replaced by MLGym's own, the channel named in a comment: the
    scorer runs it MLGym's way (so verification refuses it as a generated task) instead of on its own coloring.py."""
    tree = tmp_path / "tree"
    (tree / "configs" / "tasks").mkdir(parents=True)
    shutil.copy(BUILTIN / "configs" / "tasks" / "graphColoring.yaml", tree / "configs" / "tasks")
    shutil.copytree(BUILTIN / "data" / "graphColoring", tree / "data" / "graphColoring")
    yaml = tree / "configs" / "tasks" / "graphColoring.yaml"
    assert _environment(tree, yaml, tmp_path).isolated
    script = tree / "data" / "graphColoring" / "evaluate.py"
    lines = script.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("try:"))
    script.write_text("".join(lines[:start] + ["# gymforge would hand the submission over through gymforge_eval\n",
                                               "from importlib import import_module as import_submission\n"]
                              + lines[start + 4:]))
    assert not _environment(tree, yaml, tmp_path).isolated


def test_every_shipped_task_keeps_its_classification(tmp_path):
    """The built-in benchmark suite and the MLGym and attack fixtures: each evaluator is classified as the former
    substring rule ("gymforge_eval" anywhere in the script) classified it; MLGym's own tasks stay outside the contract."""
    seen = {}
    for root in (BUILTIN, REPO / "tests" / "fixtures" / "mlgym", REPO / "tests" / "fixtures" / "attacks"):
        for yaml in sorted((root / "configs" / "tasks").glob("*.yaml")):
            env = _environment(root, yaml, tmp_path)
            task = env.task
            script = root / env.installation.layout().get(task.evaluation_paths[0], task.evaluation_paths[0])
            substring = task.task_entrypoint == "CSVSubmissionTasks" or "gymforge_eval" in script.read_text()
            assert env.isolated == substring, yaml
            seen[task.id] = env.isolated
    assert seen["graphColoring"] and seen["polyModel"] and seen["bigramLM"] and seen["blobClustering"]
    assert not seen["stagHuntDuel"] and not seen["modelTiny"] and not seen["lmTiny"]
    assert len(seen) >= 15
