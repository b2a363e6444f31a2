"""Stage 3.4: verification and both branches of the self-debug loop, on a real generated task."""

import json

import pytest

from gymforge.core.config import validate_config
from gymforge.tasks.environment import TaskEnvironment
from gymforge.hub import get_hub
from gymforge.sandbox import get_sandbox
from gymforge.core.records import ProposalRecord, TaskProposal, VerificationReport
from gymforge.stages.generation import task_configs, starter_code
from gymforge.stages.verification import verify_environment

pytestmark = pytest.mark.slow
TOPIC = "Nearest-neighbour methods for iris species recognition"


def make_cfg(root, **verification):
    return validate_config({"results_dir": str(root / "results"), "cache_dir": str(root.parent / "cache"),
                            "verification": {"episode_max_steps": 8, **verification}})


@pytest.fixture(scope="module")
def broken_task(tmp_path_factory):
    """A generated task whose baseline then crashes at run time, as a teacher's first draft might."""
    root = tmp_path_factory.mktemp("verify")
    cfg = make_cfg(root / "gen")
    details = get_hub(cfg).describe("sklearn/iris", n_rows=3)
    proposal = ProposalRecord(item="t0000", status="ok", topic=TOPIC, dataset=details.model_dump(mode="json"),
                              proposal=TaskProposal(topic=TOPIC, metric="accuracy (higher is better)",
                                                    description="Classify iris species.", dataset="sklearn/iris"))
    files = {"proposal": root / "proposal.json", "configs": root / "configs.json", "code": root / "task" / "status.json"}
    files["proposal"].write_text(proposal.model_dump_json())
    assert task_configs(cfg, "t0000", files["proposal"], files["configs"]).status == "ok"
    record = starter_code(cfg, "t0000", files["proposal"], files["configs"], files["code"], root / "task" / "mlgym")
    assert record.status == "ok"
    baseline_path = next(p for p in record.files if p.endswith("/baseline.py"))
    broken = record.files[baseline_path].replace("def main() -> None:\n",
                                                 "def main() -> None:\n    raise KeyError('sepal_length_cm')\n", 1)
    assert broken != record.files[baseline_path]
    record.files[baseline_path] = broken
    (root / "task" / "mlgym" / baseline_path).write_text(broken)
    files["code"].write_text(record.model_dump_json())
    return root, files


def run_verify(root, files, name, **verification) -> VerificationReport:
    cfg = make_cfg(root / name, **verification)
    out = root / name / "environments" / "t0000"
    return verify_environment(cfg, "t0000", files["proposal"], files["configs"], files["code"], root / "task" / "mlgym",
                  out / "report.json", out / "verified")


@pytest.mark.parametrize("p_debug, branch", [(1.0, "debug"), (0.0, "restart")])
def test_runtime_error_is_repaired_by_either_branch(broken_task, p_debug, branch):
    root, files = broken_task
    source_yaml = next((root / "task" / "mlgym" / "configs" / "tasks").glob("*.yaml")).read_bytes()
    # A restart draws a fresh first draft, which may carry a bug of its own: allow a few.
    report = run_verify(root, files, branch, p_debug=p_debug, max_iterations=5)
    assert report.status == "ok", report.reason
    first, *later = report.iterations
    assert "sepal_length_cm" in "\n".join(first.errors)
    assert later and all(it.source == branch for it in later)
    assert not later[-1].errors and report.baseline_scores
    assert later[-1].episode_exit_status
    # The source tree is never rewritten; the verified copy carries the baseline scores.
    assert next((root / "task" / "mlgym" / "configs" / "tasks").glob("*.yaml")).read_bytes() == source_yaml
    verified = root / branch / "environments" / "t0000" / "verified"
    task_yaml = next((verified / "mlgym" / "configs" / "tasks").glob("*.yaml"))
    assert "baseline_scores" in task_yaml.read_text()
    assert list((verified / "episode").glob("*.traj"))
    saved = json.loads((verified.parent / "report.json").read_text())
    assert saved["iterations"][1]["source"] == branch


def test_labels_are_hidden_and_baseline_reproduces(broken_task):
    root, files = broken_task
    report = VerificationReport.model_validate_json(
        (root / "debug" / "environments" / "t0000" / "report.json").read_text())
    assert report.hidden_columns == {"test": ["species"]}
    verified = root / "debug" / "environments" / "t0000" / "verified" / "mlgym"
    env = TaskEnvironment(next((verified / "configs" / "tasks").glob("*.yaml")), root=verified,
                          sandbox=get_sandbox("local"), run_dir=root / "rerun", hidden_columns=report.hidden_columns)
    env.install()
    from datasets import load_from_disk

    assert "species" not in load_from_disk(str(env.workspace / "data"))["test"].column_names
    assert env.run_baseline().metrics == report.baseline_scores[0]


def test_hopeless_task_is_discarded_with_its_errors(broken_task):
    root, files = broken_task
    report = run_verify(root, files, "hopeless", max_iterations=1)
    assert report.status == "discarded" and report.reason_code == "verification_failed"
    assert "sepal_length_cm" in report.reason
    assert not any((root / "hopeless" / "environments" / "t0000" / "verified").iterdir())
