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


@pytest.fixture(scope="module")
def debugged(broken_task) -> VerificationReport:
    """The broken task verified through the debug branch (into `<root>/debug`), for every test that reads it."""
    root, files = broken_task
    return run_verify(root, files, "debug", p_debug=1.0, max_iterations=5)


@pytest.mark.parametrize("p_debug, branch", [(1.0, "debug"), (0.0, "restart")])
def test_runtime_error_is_repaired_by_either_branch(broken_task, p_debug, branch, request):
    root, files = broken_task
    source_yaml = next((root / "task" / "mlgym" / "configs" / "tasks").glob("*.yaml")).read_bytes()
    # A restart draws a fresh first draft, which may carry a bug of its own: allow a few.
    report = (request.getfixturevalue("debugged") if branch == "debug"
              else run_verify(root, files, branch, p_debug=p_debug, max_iterations=5))
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


def test_labels_are_hidden_and_baseline_reproduces(broken_task, debugged):
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


def test_its_work_runs_in_tmpdir_and_only_the_results_land_in_results(broken_task, tmp_path, monkeypatch):
    """On a cluster $TMPDIR is the node's own disk: the baseline's run folder lives there while it runs, the report
    and the verified folder land in results/ (atomically), and nothing is left in $TMPDIR or beside them."""
    import gymforge.stages.verification as verification

    node = tmp_path / "node-tmp"
    node.mkdir()
    monkeypatch.setenv("TMPDIR", str(node))
    runs = []

    def spy(cfg, tree, run_dir, *args):
        runs.append((run_dir, sorted(p.name for p in node.iterdir())))
        return check_baseline(cfg, tree, run_dir, *args)

    check_baseline = verification.check_baseline
    monkeypatch.setattr(verification, "check_baseline", spy)
    root, files = broken_task
    report = run_verify(root, files, "scratch", max_iterations=1)
    assert report.status == "discarded" and runs
    for run_dir, in_tmp in runs:
        assert run_dir.is_relative_to(node) and [n for n in in_tmp if n.startswith("gymforge-")], (run_dir, in_tmp)
    assert not list(node.iterdir())
    out = root / "scratch" / "environments" / "t0000"
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "verified"]


class _First:
    """A draw that always takes the first branch: the inner-join scorer with a row count check."""

    def random(self) -> float:
        return 0.0


@pytest.fixture(scope="module")
def sloppy_task(broken_task, tmp_path_factory):
    """The same generated task with a runnable baseline and an evaluator that inner-joins on the id after
    checking only the row count (MLGym's titanic bug)."""
    from gymforge.core.records import GenerationRecord
    from gymforge.offline import families
    from gymforge.offline.families.tabular import sloppy_csv_evaluate

    root, files = broken_task
    target = tmp_path_factory.mktemp("sloppy")
    proposal = ProposalRecord.model_validate_json(files["proposal"].read_text())
    configs = GenerationRecord.model_validate_json(files["configs"].read_text())
    record = GenerationRecord.model_validate_json(files["code"].read_text())
    baseline = next(p for p in record.files if p.endswith("/baseline.py"))
    record.files[baseline] = record.files[baseline].replace("    raise KeyError('sepal_length_cm')\n", "", 1)
    evaluation = next(p for p in record.files if p.endswith("/evaluate.py"))
    spec = families.spec_from_configs(configs.files, proposal.dataset)
    record.files[evaluation] = sloppy_csv_evaluate(record.files[evaluation], spec, _First())
    assert "merge(truth, on=ID)" in record.files[evaluation]
    import shutil

    shutil.copytree(root / "task" / "mlgym", target / "task" / "mlgym")
    for path in (baseline, evaluation):
        (target / "task" / "mlgym" / path).write_text(record.files[path])
    sloppy_files = {**files, "code": target / "task" / "status.json"}
    sloppy_files["code"].write_text(record.model_dump_json())
    return target, sloppy_files


def test_gameable_evaluator_is_repaired_with_the_probes_evidence(sloppy_task):
    root, files = sloppy_task
    report = run_verify(root, files, "repair", p_debug=1.0, max_iterations=3)
    assert report.status == "ok", report.reason
    first, *later = report.iterations
    assert first.gameable and first.episode_exit_status is None  # no teacher episode on a gameable task
    gamed = [p for p in first.probes if p.gameable]
    assert gamed and gamed[0].name.startswith(("repeat_id", "duplicate_rows", "unknown_ids", "missing_rows"))
    (metric,) = first.baseline_scores  # accuracy or macro_f1, as the offline config writer drew it
    assert gamed[0].score > first.baseline_scores[metric]
    evidence = "\n".join(first.errors)
    assert "gameable" in evidence and gamed[0].name in evidence and "submission.csv" in evidence
    # The repair (a clean draft) passes every probe: each rejected or no better, none skipped.
    last = later[-1]
    assert later[0].source == "debug" and not last.gameable and last.episode_exit_status
    assert len(last.probes) >= 20 and not any(p.gameable for p in last.probes)
    assert report.metric == metric and report.higher_is_better is True


def test_still_gameable_task_is_discarded_as_gameable_evaluator(sloppy_task):
    root, files = sloppy_task
    report = run_verify(root, files, "gameable", max_iterations=1)
    assert report.status == "discarded" and report.reason_code == "gameable_evaluator"
    assert "gameable" in report.reason
    assert not any((root / "gameable" / "environments" / "t0000" / "verified").iterdir())


# -- a generated Python task whose evaluator imports the submission itself -----------------------------------------

# The agent's coloring.py when the scorer imports it in its own process: it reads the held-out graphs, writes a perfect
# score (and an answer, as a metric the agent is shown) where score.py's metrics go, and ends the scorer before the
# evaluator computes anything.
COUNTERFEIT = '''
import json, os
graphs = json.load(open(os.path.join(os.environ["GYMFORGE_SECRETS"], "test_graphs.json")))
argv = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
out = argv[next(i for i, a in enumerate(argv) if a.endswith("score.py")) + 1]
for name, text in (("stdout", json.dumps({"colors": 1.0, "answer_n0": graphs[0]["n"]})),
                   ("status.json", json.dumps({"exit": 0, "error": None}))):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
os._exit(0)
'''


def _coloring_tree(dest, direct: bool):
    """The built-in graphColoring task as a generated tree; `direct`: its evaluate.py imports coloring itself, as
    MLGym's evaluators do, instead of through gymforge_eval."""
    import shutil

    from attacks.harness import BUILTIN

    (dest / "configs" / "tasks").mkdir(parents=True)
    shutil.copy(BUILTIN / "configs" / "tasks" / "graphColoring.yaml", dest / "configs" / "tasks")
    shutil.copytree(BUILTIN / "data" / "graphColoring", dest / "data" / "graphColoring")
    if direct:
        script = dest / "data" / "graphColoring" / "evaluate.py"
        lines = script.read_text().splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith("try:"))
        text = "".join(lines[:start] + ["from importlib import import_module as import_submission\n"]
                       + lines[start + 4:])
        assert "gymforge_eval" not in text and "import_submission(\"coloring\")" in text
        script.write_text(text)
    return dest


def test_an_evaluator_that_imports_the_submission_lets_it_counterfeit_the_score(tmp_path):
    """Why verification refuses such a task: scored as MLGym scores (the agent's module in the scorer's process), the
    agent's code reads the answers and hands in any score it likes, shown back to the agent."""
    env = TaskEnvironment(_coloring_tree(tmp_path / "tree", direct=True) / "configs" / "tasks" / "graphColoring.yaml",
                          root=tmp_path / "tree", sandbox=get_sandbox("local"), run_dir=tmp_path / "run")
    env.install()
    assert not env.isolated
    (env.workspace / "coloring.py").write_text(COUNTERFEIT)
    metrics, _ = env.evaluate()
    first_n = json.loads((tmp_path / "tree" / "data" / "graphColoring" / "test_graphs.json").read_text())[0]["n"]
    assert metrics == {"colors": 1.0, "answer_n0": first_n}  # baseline 5.67: lower is better


@pytest.mark.parametrize("direct", [True, False], ids=["imports-the-submission", "through-gymforge_eval"])
def test_verification_refuses_a_task_whose_scorer_would_run_the_agents_code(tmp_path, direct):
    from gymforge.core.config import GymforgeConfig
    from gymforge.core.records import VerificationIteration
    from gymforge.stages.verification import check_baseline

    tree = _coloring_tree(tmp_path / "tree", direct)
    it = VerificationIteration(iteration=1, source="generation", task_id="graphColoring")
    checked = check_baseline(GymforgeConfig(results_dir=str(tmp_path / "results")), tree, tmp_path / "run", None, it)
    if direct:  # refused before its baseline runs, with the reason the teacher's repair prompt carries
        assert checked is None and not it.baseline_scores
        [error] = it.errors
        assert "does not use gymforge_eval" in error and "beside the answers" in error and "import_submission" in error
    else:  # the same task through the channel is verified as before
        assert checked is not None, it.errors
        assert it.baseline_scores == {"colors": pytest.approx(5.666667)}
