"""Verification stage: install each task, run its baseline and one teacher episode; on failure, debug or regenerate."""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from pathlib import Path

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.runtime import nodelocal, resources
from gymforge.core.records import (GenerationRecord, ProposalRecord, VerificationIteration, VerificationReport,
                            derive_seed)
from gymforge.tasks.coherence import check_coherence, teacher_judge
from gymforge.tasks.metrics import metric_direction, natural_direction, same_metric, stated_direction
from gymforge.stages.generation import draft_code, draft_configs, materialize_task
from gymforge.student.cpu_training import prepare_cpu_process
from gymforge.tasks.files import AGENT_CODE_ENTRYPOINTS, answer_columns
from gymforge.tasks.mlgym import load_task_config
from gymforge.tasks.posttraining import PostTrainingError, check_headroom
from gymforge.tasks.probes import CheckError, evidence, probe_environment
from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.llm.client import make_client
from gymforge.tasks.environment import BaselineFailed, InstallError, TaskUnsupported
from gymforge.tasks.episode import EpisodeRunner

EXCERPT = 2000


def _tail(text: str) -> str:
    return text if len(text) <= EXCERPT else "..." + text[-EXCERPT:]


def _task_yaml(tree: Path) -> Path:
    return next((tree / "configs" / "tasks").glob("*.yaml"))


def tree_needs_gpu(cfg: GymforgeConfig, tree: Path) -> bool:
    """Whether the code of the task in `tree` needs a GPU (`gymforge.runtime.resources.needs_gpu`: an LMSubmissionTasks
    task, or a post-training task on a base other than the CPU build); True when its task config cannot be read."""
    try:
        entrypoint = load_task_config(_task_yaml(tree)).task_entrypoint
    except (OSError, StopIteration, ValueError):
        return True
    spec = next(tree.rglob(resources.SPEC_FILE), None)
    return resources.needs_gpu(cfg, entrypoint, resources.spec_base(spec.read_text()) if spec else None)


def tree_gpus(cfg: GymforgeConfig, tree: Path) -> int:
    """The GPUs the task in `tree` runs with, as its jobs declare them: `trajectories.gpus` when its code needs a GPU,
    else none."""
    return cfg.trajectories.gpus if tree_needs_gpu(cfg, tree) else 0


def runs_agent_code_beside_answers(env) -> str | None:
    """Why the installed generated task `env` would be scored with the agent's code in the scorer's sandbox, beside the
    answers (None: it would not). A Python or model task whose evaluation script does not reach the submission through
    `gymforge_eval` is scored as MLGym scores third-party tasks (`Scoring.isolated`, the predicate the scorer itself
    uses): on a copy of the whole workspace, the agent's module imported into the scorer's process, where it can print
    any metrics line, exit before the evaluator does, or read /answers. The evaluator probes cannot see this (an honest
    evaluator that imports the submission itself scores degenerate submissions honestly), so a generated task is
    refused here, before its baseline runs, and goes back to the teacher with this reason."""
    entrypoint = env.task.task_entrypoint
    if entrypoint not in AGENT_CODE_ENTRYPOINTS or env.isolated:
        return None
    what = "module through `import_submission(\"<module>\")`" if entrypoint == "PythonSubmissionTasks" \
        else "pickled model through `load_pickle(<path>)`"
    return (f"the evaluation script {env.task.evaluation_paths[0]} does not use gymforge_eval, so the agent's code "
            "would run inside the scorer's process, beside the answers, and could print a counterfeit score or read "
            f"them; reach the submission's {what} from gymforge_eval, with the ImportError fallback for MLGym "
            "(`try: from gymforge_eval import import_submission, load_pickle` / `except ImportError: ...`)")


def check_baseline(cfg: GymforgeConfig, tree: Path, run_dir: Path, hidden, it: VerificationIteration):
    """Install the task of `tree` in `run_dir`, run its baseline and evaluate the artefact: the part of a
    verification that needs no teacher (micro tasks reuse it). A task the scorer would run with the agent's code beside
    the answers is refused first (`runs_agent_code_beside_answers`). Errors land in `it.errors`, the time in
    `it.timings_s["baseline"]`; returns (environment, BaselineReport), or None on an error."""
    started = time.monotonic()
    # the task's GPUs as its rollouts will have them: trajectories.gpus for a task whose code needs a GPU, else none
    # (what rule verify_environment declares, gymforge.runtime.resources.task_gpus)
    runner = EpisodeRunner.for_config(cfg, tree_gpus(cfg, tree))
    env = runner.environment(_task_yaml(tree), root=tree, run_dir=run_dir, hidden_columns=hidden)
    try:
        env.install()
        refused = runs_agent_code_beside_answers(env)
        if refused is None:
            report = env.run_baseline()
        else:
            it.errors.append(refused)
    except BaselineFailed as err:
        it.errors.append(f"running the baseline failed: {err}\noutput tail:\n{_tail(err.result.output)}")
    except (SubmissionNotFound, EvaluationFormatError) as err:
        # The task's author sees the evaluation's whole output (the agent never does: it had the answers).
        detail = getattr(err, "detail", "")
        it.errors.append(f"evaluating the baseline's artefact failed: {err}"
                         + (f"\nthe evaluation's output tail:\n{_tail(detail)}" if detail.strip() else ""))
    except (InstallError, TaskUnsupported) as err:
        it.errors.append(f"the task cannot be installed: {err}")
    it.timings_s["baseline"] = round(time.monotonic() - started, 3)
    if it.errors:
        return None
    it.baseline_scores = report.metrics
    return env, report


def proposal_metric(metric_text: str, measured: dict[str, float], description: str = "") -> tuple[str, bool]:
    """The metric the proposal ranks by, as the evaluation names it, and its direction. When the evaluation
    prints no metric of that name (or a synonym) but only one, that one stands for it, with the direction the task's
    description states for it (else the one its name implies): the proposal's direction was about another
    metric."""
    name, higher_is_better = metric_direction(metric_text)
    found = next((k for k in measured if k.lower() == name.lower()), None)
    found = found or next((k for k in measured if same_metric(name, k)), None)
    if found is None and len(measured) == 1:
        found = next(iter(measured))
        stated = stated_direction(description, found) if description else None
        natural = natural_direction(found)
        higher_is_better = stated if stated is not None else natural if natural is not None else \
            metric_direction(found)[1]
    return found or name, higher_is_better


def check_task_coherence(cfg: GymforgeConfig, env, baseline: dict[str, float], metric: str, higher_is_better: bool,
                         dataset_id: str | None, seed: int, it: VerificationIteration) -> bool:
    """The coherence check of the installed task whose workspace holds the baseline's artefact (`verification.
    coherence`); recorded in `it`. False (with the evidence in `it.errors`) when its text contradicts it."""
    started = time.monotonic()

    def judge(context):  # the teacher's client only when the rules found nothing and the prose needs reading
        with make_client(cfg, "verification") as llm:
            return teacher_judge(llm, seed)(context)

    try:
        report = check_coherence(env, baseline, metric=metric, higher_is_better=higher_is_better,
                                 dataset_id=dataset_id, judge=judge if cfg.verification.coherence == "teacher" else None)
    finally:
        it.timings_s["coherence"] = round(time.monotonic() - started, 3)
    it.coherence, it.incoherent = report, not report.coherent
    if not report.coherent:
        it.errors.append(report.evidence())
    return report.coherent


def probe_evaluator(env, baseline: dict[str, float], metric: str, higher_is_better: bool, seed: int,
                    it: VerificationIteration) -> bool:
    """Run the evaluator probes on the installed task whose workspace holds the baseline's artefact; record the
    outcomes in `it`. False (with the evidence in `it.errors`) when the evaluator is gameable."""
    started = time.monotonic()
    try:
        report = probe_environment(env, seed=seed, metric=metric, higher_is_better=higher_is_better,
                                   baseline=(baseline, "measured"), stop_at_first=True)
    except CheckError as err:
        it.errors.append(f"the evaluator could not be probed: {err}")
        return False
    finally:
        it.timings_s["probes"] = round(time.monotonic() - started, 3)
    it.probes, it.gameable = report.probes, report.gameable
    if report.gameable:
        it.errors.append(evidence(report))
    return not report.gameable


def reference_headroom(cfg: GymforgeConfig, env, baseline: dict[str, float], higher_is_better: bool,
                       it: VerificationIteration) -> bool:
    """Post-training tasks: a short reference SFT of the base (`post_training.reference_sft`) must beat the base
    model, the baseline; recorded in `it`. False (with the reason in `it.errors`) when it does not."""
    started = time.monotonic()
    try:
        found = check_headroom(env, baseline, cfg.post_training.reference_sft, higher_is_better)
    except (PostTrainingError, OSError, RuntimeError, ValueError) as err:
        it.errors.append(f"the reference SFT failed: {type(err).__name__}: {err}")
        return False
    finally:
        it.timings_s["reference_sft"] = round(time.monotonic() - started, 3)
    it.headroom, it.no_headroom = found.model_dump(), not found.ok
    if not found.ok:
        it.errors.append(found.reason)
    return found.ok


def _attempt(cfg: GymforgeConfig, tree: Path, work: Path, hidden, episode_dir: Path, seed: int,
             it: VerificationIteration, metric_text: str, dataset_id: str | None = None):
    """Baseline + evaluation, the coherence check, the evaluator probes, then one teacher episode. Errors land in
    `it.errors`; returns the baseline env."""
    checked = check_baseline(cfg, tree, work / "baseline", hidden, it)
    if checked is None:
        return None
    env, report = checked
    metric, higher_is_better = proposal_metric(metric_text, report.metrics, env.task.description or "")
    if cfg.verification.coherence != "off" and not check_task_coherence(
            cfg, env, report.metrics, metric, higher_is_better, dataset_id, derive_seed(seed, "coherence"), it):
        return None
    if cfg.verification.probes and not probe_evaluator(env, report.metrics, metric, higher_is_better,
                                                       derive_seed(seed, "probes"), it):
        return None
    if env.post_training is not None and not reference_headroom(cfg, env, report.metrics, higher_is_better, it):
        return None

    started = time.monotonic()
    runner = EpisodeRunner.for_config(cfg, tree_gpus(cfg, tree))
    try:
        with make_client(cfg, "verification") as llm:
            traj = asyncio.run(runner.run(llm, _task_yaml(tree), root=tree, run_dir=work / "episode",
                                          max_steps=cfg.verification.episode_max_steps, seed=seed,
                                          baseline=report.metrics, meta={"stage": "verification"},
                                          hidden_columns=hidden, out_dir=episode_dir))
            it.episode_exit_status = traj.info.exit_status
            usage = llm.usage
    except Exception as err:  # noqa: BLE001 - any crash of the episode is a task error the teacher must see
        it.errors.append(f"the agent episode crashed: {type(err).__name__}: {err}")
        return None
    finally:
        it.timings_s["episode"] = round(time.monotonic() - started, 3)
    return env, usage


def verify_environment(cfg: GymforgeConfig, slot: str, proposal: Path, configs: Path, code: Path,
           tree: Path, report_out: Path, env_out: Path) -> VerificationReport:
    prepare_cpu_process()  # a post-training task's reference SFT trains here, beside other jobs on the same cores
    proposal_record = ProposalRecord.model_validate_json(Path(proposal).read_text())
    configs_record = GenerationRecord.model_validate_json(Path(configs).read_text())
    code_record = GenerationRecord.model_validate_json(Path(code).read_text())
    with atomic.directory(env_out) as verified:
        if code_record.status != "ok":
            report = VerificationReport(item=slot, status="skipped", reason_code=code_record.reason_code, reason=code_record.reason)
        else:
            # the task's baseline, probes and episode run in node-local scratch ($TMPDIR when set); only the verified
            # copy and the report land in results/, each moved into place atomically
            with nodelocal.scratch(Path(env_out), f".{slot}-work") as scratch:
                report = _verify(cfg, slot, proposal_record, configs_record, code_record, Path(tree), verified,
                                 scratch)
    atomic.write_text(report_out, report.model_dump_json(indent=2))
    return report


def _verify(cfg: GymforgeConfig, slot: str, proposal: ProposalRecord, configs: GenerationRecord,
            code: GenerationRecord, tree: Path, verified: Path, scratch: Path) -> VerificationReport:
    report = VerificationReport(item=slot, status="ok", task_id=code.task_id, entrypoint=code.entrypoint)
    source, last_good = "generation", code
    metric_text = proposal.proposal.metric if proposal.proposal else ""
    for iteration in range(1, cfg.verification.max_iterations + 1):
        it = VerificationIteration(iteration=iteration, source=source, task_id=code.task_id)
        report.iterations.append(it)
        episode_dir = scratch / f"episode{iteration}"
        outcome = None
        if code.status != "ok":
            it.errors.append(f"regenerating the task failed: {code.reason}")
        else:
            last_good = code
            hidden = answer_columns(proposal, code)
            outcome = _attempt(cfg, tree, scratch / f"run{iteration}", hidden, episode_dir,
                               derive_seed(cfg.seed, "verification", slot, iteration), it, metric_text,
                               proposal.dataset.get("id") if proposal.dataset else None)
        if outcome is not None:
            env, episode_usage = outcome
            report.usage.add(episode_usage)
            env.write_verified_copy(verified / "mlgym", [it.baseline_scores])
            shutil.copytree(episode_dir, verified / "episode")
            report.baseline_scores, report.hidden_columns = [it.baseline_scores], hidden
            report.task_id, report.entrypoint = code.task_id, code.entrypoint
            report.needs_gpu = tree_needs_gpu(cfg, tree)  # what its micro variant and shards ask for
            report.metric, report.higher_is_better = proposal_metric(
                metric_text, it.baseline_scores or {}, env.task.description or "")
            break
        if iteration == cfg.verification.max_iterations:
            report.status = "discarded"
            report.reason_code = ("incoherent_task" if it.incoherent else "gameable_evaluator" if it.gameable
                                  else "no_headroom" if it.no_headroom else "verification_failed")
            report.reason = f"still failing after {iteration} iterations: " + "; ".join(it.errors)[:EXCERPT]
            break
        # The self-debug loop: repair the code with the errors (p_debug) or regenerate from the configs.
        rng = random.Random(derive_seed(cfg.seed, "debug-branch", slot, iteration))
        if it.incoherent:
            # The text is what is wrong: configs and code go back together, with the check's evidence.
            source = "coherence"
            configs = draft_configs(cfg, slot, proposal, variant=iteration, previous=configs.files,
                                    errors=it.errors)
            report.usage.add(configs.usage)
            code = (draft_code(cfg, slot, configs, proposal, variant=iteration, previous=last_good.files,
                               runtime_errors=it.errors) if configs.status == "ok" else configs)
        elif rng.random() < cfg.verification.p_debug:
            source = "debug"
            code = draft_code(cfg, slot, configs, proposal, variant=iteration, previous=last_good.files,
                              runtime_errors=it.errors)
        else:
            source = "restart"
            configs = draft_configs(cfg, slot, proposal, variant=iteration)
            report.usage.add(configs.usage)
            code = draft_code(cfg, slot, configs, proposal, variant=iteration) if configs.status == "ok" else configs
        report.usage.add(code.usage)
        if code.status == "ok":
            tree = scratch / f"tree{iteration}"
            materialize_task(cfg, tree, configs, code, proposal)
    return report
