"""The coherence check on a real generated task in the sandbox: a submission written as the text says is scored by
the task's own evaluator, the teacher (the offline one, on loopback) reads the prose, and verification repairs an
incoherent task with the evidence or discards it as `incoherent_task`."""

import pytest

from gymforge.core.config import validate_config
from gymforge.core.records import GenerationRecord, ProposalRecord, TaskProposal
from gymforge.hub import get_hub
from gymforge.llm.client import make_client
from gymforge.report.funnel import _repairs
from gymforge.sandbox import get_sandbox
from gymforge.stages.generation import starter_code, task_configs
from gymforge.stages.verification import verify_environment
from gymforge.tasks.coherence import check_coherence, teacher_judge
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.mlgym import load_task_config

pytestmark = pytest.mark.slow
TOPIC = "Nearest-neighbour methods for iris species recognition"
SLIP = "The evaluation reports mean absolute error (lower is better) on held-out labels."


def make_cfg(root, **verification):
    return validate_config({"results_dir": str(root / "results"), "cache_dir": str(root.parent / "cache"),
                            "verification": {"episode_max_steps": 6, "p_debug": 1.0, **verification}})


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A generated iris task (repaired until valid) with its first sentence replaced by one that names MAE."""
    root = tmp_path_factory.mktemp("coherence")
    cfg = make_cfg(root / "gen")
    details = get_hub(cfg).describe("sklearn/iris", n_rows=3)
    proposal = ProposalRecord(item="t0000", status="ok", topic=TOPIC, dataset=details.model_dump(mode="json"),
                              proposal=TaskProposal(topic=TOPIC, metric="accuracy (higher is better)",
                                                    description="Classify iris species.", dataset="sklearn/iris"))
    files = {"proposal": root / "proposal.json", "configs": root / "configs.json", "code": root / "task" / "status.json"}
    files["proposal"].write_text(proposal.model_dump_json())
    assert task_configs(cfg, "t0000", files["proposal"], files["configs"]).status == "ok"
    assert starter_code(cfg, "t0000", files["proposal"], files["configs"], files["code"],
                        root / "task" / "mlgym").status == "ok"
    configs = GenerationRecord.model_validate_json(files["configs"].read_text())
    path = next(p for p in configs.files if p.startswith("configs/tasks/"))
    slipped = configs.files[path].replace("Classify iris species.", SLIP, 1)
    assert slipped != configs.files[path]
    configs.files[path] = slipped
    files["configs"].write_text(configs.model_dump_json())
    (root / "task" / "mlgym" / path).write_text(slipped)
    return root, files


@pytest.fixture(scope="module")
def installed(task):
    root, _ = task
    tree = root / "task" / "mlgym"
    env = TaskEnvironment(next((tree / "configs" / "tasks").glob("*.yaml")), root=tree, sandbox=get_sandbox("local"),
                          run_dir=root / "installed", hidden_columns={"test": ["species"]})
    env.install()
    return env, env.run_baseline().metrics


def with_description(env, old: str, new: str):
    """The installed task with its description edited (the workspace, data and evaluator as installed)."""
    original = load_task_config(env.task_yaml)
    assert old in original.description
    env.installation.task = original.model_copy(update={"description": original.description.replace(old, new)})
    return env


def test_the_slip_is_flagged_with_its_sentence_and_the_coherent_text_passes(installed):
    env, printed = installed
    metric = next(iter(printed))
    env.installation.task = load_task_config(env.task_yaml)
    report = check_coherence(env, printed, metric=metric, higher_is_better=True)
    assert not report.coherent and [f.kind for f in report.findings] == ["metric"]
    assert report.findings[0].evidence == SLIP and report.findings[0].stated == "mean absolute error"
    coherent = with_description(env, SLIP, f"The evaluation reports {metric} (higher is better) on held-out labels.")
    report = check_coherence(coherent, printed, metric=metric, higher_is_better=True)
    assert report.coherent, report.findings
    # the submission written as the text says (columns id, species; 0-based ids) is scored like the baseline's
    assert report.submission["metrics"] == printed


@pytest.mark.parametrize("old, new, kind", [
    ("0-based position", "1-based position", "id_base"),
    ("columns id, species", "columns id, label", "columns"),
])
def test_a_submission_written_as_the_text_says_is_refused_by_the_evaluator(installed, old, new, kind):
    env, printed = installed
    env.installation.task = load_task_config(env.task_yaml)
    env = with_description(env, SLIP, "Classify iris species.")
    env = with_description(env, old, new)
    report = check_coherence(env, printed, metric=next(iter(printed)), higher_is_better=True)
    assert kind in [f.kind for f in report.findings]
    assert "rejected" in report.submission  # the evaluator itself refused what the text asks for
    assert env.evaluate()[0] == printed  # the baseline's artefact is back in place


def test_the_offline_teacher_reads_a_metric_described_in_words(installed, task):
    env, printed = installed
    root, _ = task
    env.installation.task = load_task_config(env.task_yaml)
    env = with_description(env, SLIP, "Predictions are scored by the average absolute difference from the label.")
    cfg = make_cfg(root / "judge")
    with make_client(cfg, "verification") as llm:
        report = check_coherence(env, printed, metric=next(iter(printed)), higher_is_better=True,
                                 judge=teacher_judge(llm, seed=1))
    assert report.teacher == "incoherent" and [f.by for f in report.findings] == ["teacher"]
    assert "average absolute difference" in report.findings[0].evidence


def run_verify(root, files, name, **verification):
    cfg = make_cfg(root / name, **verification)
    out = root / name / "environments" / "t0000"
    return verify_environment(cfg, "t0000", files["proposal"], files["configs"], files["code"],
                              root / "task" / "mlgym", out / "report.json", out / "verified")


def test_verification_repairs_an_incoherent_task_with_the_evidence(task):
    root, files = task
    report = run_verify(root, files, "repair", max_iterations=3)
    assert report.status == "ok", report.reason
    first, *later = report.iterations
    assert first.incoherent and first.episode_exit_status is None and first.probes == []
    assert SLIP in "\n".join(first.errors)
    assert later[0].source == "coherence" and later[-1].coherence.coherent
    assert _repairs([report]) == {"incoherent_task": 1}
    verified = root / "repair" / "environments" / "t0000" / "verified" / "mlgym"
    text = next((verified / "configs" / "tasks").glob("*.yaml")).read_text()
    assert "mean absolute error" not in text


def test_a_task_still_incoherent_is_discarded_as_incoherent_task(task):
    root, files = task
    report = run_verify(root, files, "discard", max_iterations=1)
    assert report.status == "discarded" and report.reason_code == "incoherent_task"
    assert SLIP in report.reason
