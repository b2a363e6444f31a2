"""gymforge.tasks.harbor without a sandbox: reading task.toml, the schema check and the leak search that
`check-task FOLDER` reports (the trials themselves: tests/interop/test_interop_harbor.py)."""

from __future__ import annotations

from pathlib import Path

from test_interop_harbor import HELLO, ML, write_task

from gymforge.tasks.harbor import HarborTask, find_leaks, validate_folder


def test_a_folder_to_harbors_spec_has_no_schema_problem_and_faults_are_named(tmp_path: Path) -> None:
    assert validate_folder(write_task(tmp_path / "hello", HELLO))[1] == []
    assert validate_folder(write_task(tmp_path / "ml", ML))[1] == []
    broken = write_task(tmp_path / "broken", {**ML, "task.toml": ML["task.toml"].replace("gpus = 1", 'gpus = "one"')
                                              + '\n[verifier.extra]\nx = 1\n'})
    (broken / "instruction.md").unlink()
    problems = validate_folder(broken)[1]
    assert "no instruction.md" in problems
    assert "task.toml: environment.gpus must be a non-negative number, not 'one'" in problems
    assert "task.toml: unknown key verifier.extra" in problems
    assert validate_folder(write_task(tmp_path / "nottoml", {**HELLO, "task.toml": "[x\n"}))[1][-1].startswith(
        "task.toml is not TOML")


def test_task_toml_artifact_tables_and_name_are_read(tmp_path: Path) -> None:
    toml = ('schema_version = "1.4"\nartifacts = ["/app/a.csv", {source = "/app/b.csv", destination = "b"}]\n\n'
            '[task]\nname = "org/tiny"\n\n[metadata]\nmetric = "acc"\n')
    task = HarborTask.read(write_task(tmp_path / "t", {**ML, "task.toml": toml}))
    assert (task.artifacts, task.name, task.metadata) == (["/app/a.csv", "/app/b.csv"], "org/tiny", {"metric": "acc"})


def test_leaks_are_answers_in_the_agents_files_not_the_data_both_sides_share(tmp_path: Path) -> None:
    answers = "id,label\n" + "".join(f"{i},{i % 3}\n" for i in range(8))
    shared = "x,y\n1,2\n3,4\n"
    folder = write_task(tmp_path / "f", {**HELLO, "tests/answers/test_labels.csv": answers,
                                         "tests/task/data/train.csv": shared, "environment/app/data/train.csv": shared})
    assert find_leaks(folder) == []  # the training data is on both sides on purpose
    assert find_leaks(folder, {"/app/submission.csv": b"id,label\n0,1\n"}) == []
    (folder / "environment" / "app" / "labels_copy.csv").write_text(answers)
    assert find_leaks(folder) == ["tests/answers/test_labels.csv is in the agent's environment as "
                                  "environment/app/labels_copy.csv"]
    (folder / "environment" / "app" / "labels_copy.csv").unlink()
    (folder / "environment" / "app" / "notes.txt").write_text("rows:\n" + answers.split("\n", 1)[1] + "end\n")
    assert find_leaks(folder) == ["the rows of tests/answers/test_labels.csv are in the agent's environment, in "
                                  "environment/app/notes.txt"]
    (folder / "environment" / "app" / "notes.txt").unlink()
    (folder / "environment" / "app" / "out.csv").write_text("label\n1\n")
    assert find_leaks(folder, {"/app/out.csv": b"label\n1\n"}) == [
        "the solution's output /app/out.csv is in the agent's environment as environment/app/out.csv"]
