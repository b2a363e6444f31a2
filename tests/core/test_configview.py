"""Stage config views (gymforge.core.configview): a step run by its rule reads only the config sections the rule
declares in `CFG.digest(...)`, so a missed rerun dependency fails the job instead of leaving its outputs stale.

Every Snakemake run of the workflow runs its jobs under that restriction (the Snakefile hands them the declared
lists), so the end-to-end runs (tests/workflow/test_pipeline.py, the session's finished run, tests/stages/test_rl.py, ...) run every
rule under it; here: the view itself, the CLI's wiring, and every rule's declaration."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from gymforge import cli
from gymforge.core.config import READABLE_EVERYWHERE, GymforgeConfig, SandboxConfig
from gymforge.core.configview import READS_ENV, UndeclaredConfigRead, restrict, write_declared

REPO = Path(__file__).resolve().parents[2]


def test_a_step_reading_an_undeclared_section_fails_naming_the_rule_the_key_and_the_fix(tmp_path, monkeypatch):
    """`gymforge topic-batch` as its rule runs it, with `topics` left out of the rule's declaration: the job fails
    before asking the teacher anything, and says which rule read which key and what to add where."""
    declared = write_declared({"topic_batch": ("rules/topics.smk", [GymforgeConfig().digest("seed", "teacher")])},
                              tmp_path)
    monkeypatch.setenv(READS_ENV, str(declared))
    config = tmp_path / "config.json"
    config.write_text(GymforgeConfig(results_dir=str(tmp_path / "results")).model_dump_json())
    with pytest.raises(SystemExit) as exit:
        cli.main(["topic-batch", "--config", str(config), "--batch", "b0000", "--previous", "--out",
                  str(tmp_path / "b.json")])
    message = str(exit.value.code)
    for part in ("`topic_batch`", "`topics.batch_size`", '"seed", "teacher"', 'add "topics"',
                 "CFG.digest(...) in rules/topics.smk"):
        assert part in message, message
    assert not (tmp_path / "b.json").exists()


def test_a_step_run_by_hand_reads_the_whole_config(monkeypatch):
    from gymforge.core.configview import for_step

    monkeypatch.delenv(READS_ENV, raising=False)
    cfg = GymforgeConfig()
    assert for_step(cfg, "topic_batch") is cfg


def test_the_view_gives_the_models_own_objects_for_what_is_declared_or_readable_everywhere():
    cfg = GymforgeConfig.model_validate({"seed": 7, "sandbox": {"memory_mb": 4096}})
    view = restrict(cfg, ("seed", "sandbox", "teacher", "verification.probes"), step="x")
    assert view.seed == 7 and view.sandbox is cfg.sandbox and isinstance(view.sandbox, SandboxConfig)
    assert view.llm.teacher is cfg.llm.teacher  # `teacher` is llm.teacher (config.SECTION_KEYS)
    assert view.verification.probes is True
    # readable everywhere: locations, the budget, plan sizes, resources
    assert view.results == Path("results") and view.llm.budget_usd == cfg.llm.budget_usd
    assert view.trajectories.per_task == cfg.trajectories.per_task and view.rl.gpus == 0
    for read, key in ((lambda: view.verification.max_iterations, "verification.max_iterations"),
                      (lambda: view.topics.batch_size, "topics.batch_size"),
                      (lambda: view.train.name, "train.student"),  # a property reads its fields through the view
                      (lambda: view.digest("seed", "rl"), "rl"),
                      (lambda: view.rerun_view()["filter"], "filter"),
                      (lambda: view.llm.model_dump(), "llm")):
        with pytest.raises(UndeclaredConfigRead, match=f"`{key}`"):
            read()
    assert view.digest("seed", "sandbox") == cfg.digest("seed", "sandbox")
    assert set(view.rerun_view()) >= {"seed", "sandbox", "teacher"}


def test_an_undeclared_read_is_not_taken_for_an_items_failure():
    """Steps record ordinary exceptions as an item's failure (a task that did not verify); this one is a bug in a
    rule and must end the job."""
    view = restrict(GymforgeConfig(), (), step="x")
    try:
        view.filter  # noqa: B018
    except Exception:  # noqa: BLE001 - what a step's `except Exception` would do
        pytest.fail("caught as an ordinary exception")
    except UndeclaredConfigRead:
        pass


def test_a_copy_of_a_view_is_a_view_and_reads_what_the_step_put_there():
    import pickle

    view = restrict(GymforgeConfig(), ("rl",), step="x")
    copied = view.model_copy(update={"evaluate": GymforgeConfig().evaluate})
    assert copied.evaluate.serving.backend == "auto" and copied.rl is not None
    with pytest.raises(UndeclaredConfigRead):
        copied.filter  # noqa: B018
    again = pickle.loads(pickle.dumps(view))
    assert again.rl == view.rl
    with pytest.raises(UndeclaredConfigRead):
        again.filter  # noqa: B018


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list):
        return value[:1]
    if isinstance(value, dict):
        return {**value, "input_per_mtok": 3.0}
    return None


NONE_VALUES = {"datasets.cache_dir": "/elsewhere", "trajectories.mem_mb": 4096, "evaluate.tasks": ["graphColoring"],
               "llm.teacher.base_url": "http://127.0.0.1:9/v1", "tracking.dir": "/elsewhere"}
OTHER_VALUES = {"rl.strategy": "ddp", "llm.teacher.token_param": "max_completion_tokens", "tracking.backend": "none"}


@pytest.mark.parametrize("key", READABLE_EVERYWHERE)
def test_a_setting_readable_everywhere_changes_no_rules_digest(key):
    """What every step may read without declaring it must be in no digest: else a rule could depend on it
    undeclared. (`llm` is the one section no rule declares: llm.teacher is declared as `teacher`.)"""
    base = GymforgeConfig()
    dump = base.model_dump(mode="json")
    *parents, last = key.split(".")
    node = dump
    for part in parents:
        node = node[part]
    node[last] = OTHER_VALUES.get(key) or (NONE_VALUES.get(key) if node[last] is None else _changed(node[last]))
    other = GymforgeConfig.model_validate(dump)
    assert other.model_dump(mode="json") != base.model_dump(mode="json"), key
    sections = [s for s in base.rerun_view() if s not in ("llm", "results_dir", "cache_dir")]
    assert {s: other.digest(s) for s in sections} == {s: base.digest(s) for s in sections}, key


# ---- every rule ---------------------------------------------------------------------------------------------


def _takes_config(target: str) -> bool:
    return "cfg" in inspect.signature(cli._step_function(target)).parameters


def test_every_rule_that_runs_a_step_declares_the_sections_its_step_reads(rule_reads):
    """The Snakefile writes every rule's declaration (its `CFG.digest(...)` params) for the jobs to read, parsed
    here by a dry run of a copy of the workflow (the `rule_reads` fixture). Each step's job looks its rule up by the
    step's name; a step that reads the config must declare something, and only paths that `rerun_view` has."""
    rules = rule_reads
    view = GymforgeConfig().rerun_view()
    for verb, (target, _help) in cli.STEPS.items():
        rule = verb.replace("-", "_")
        assert rule in rules, f"step {verb}: no rule {rule} runs it (a job finds its declaration by the step's name)"
        reads = rules[rule]["reads"]
        assert rules[rule]["file"].startswith("rules/") and (REPO / rules[rule]["file"]).is_file()
        if not _takes_config(target):
            assert reads == [], f"{rule} declares config sections its step never gets"
            continue
        assert reads, f"rule {rule} runs a step that reads the config but declares no section (CFG.digest(...))"
        assert "llm" not in reads, f"{rule}: declare `teacher`, not `llm` (its budget changes no output)"
        for section in reads:
            node = view
            for part in section.split("."):
                assert isinstance(node, dict) and part in node, f"{rule}: {section} is no rerun_view section"
                node = node[part]


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_the_finished_runs_steps_read_their_rules_config_views(finished_run: Path) -> None:
    """The restriction is on in the end-to-end runs: each step of the tiny run's `all` says in its log which view
    it read the config through (gymforge.core.configview.for_step), and they all succeeded under it."""
    logs = "".join(p.read_text(errors="replace") for p in (finished_run / "results" / "logs").rglob("*.log"))
    ran = {"topic_batch", "proposal", "task_configs", "starter_code", "verify_environment", "rollout_shard",
           "student_tokenizer", "sft_dataset", "student_base", "train_student", "decontamination", "eval_runs",
           "check_benchmark_task", "score_table"}
    missing = [rule for rule in sorted(ran) if f"config view of rule {rule}: " not in logs]
    assert not missing, f"steps that read the whole config: {missing}"
