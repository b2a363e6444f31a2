"""`gymforge check-task`: check a task's text against what it does, and probe its evaluator with knowledge-free
degenerate submissions.

A Harbor task folder (task.toml, tests/test.sh, ...) in place of the task's YAML gets the checks Harbor's contract
allows without knowing the task (`gymforge.tasks.harbor.check_harbor_task`): the folder is Harbor's, its solution
scores above doing nothing, its verifier is deterministic, and no answer is in environment/; every check that fails
is said, and any makes the exit status 1.

The task is installed as for any episode, its baseline runs (a task without a baseline script is scored as
installed, e.g. a game's untouched strategy; where nothing can be scored, as MLGym's `titanic`, its recorded
`baseline_scores` stand), then every probe of `gymforge.tasks.probes` is evaluated in the same sandboxes and
under the same evaluation contract as an agent's submission. The task is gameable when any probe is
accepted with a score strictly better than the baseline's. Before the probes, the coherence check
(`gymforge.tasks.coherence`) compares the task's description with the metrics its evaluation printed, its
declared metric, the submission the evaluation accepted and the installed data; its findings are reported (and
in the JSON report's `coherence` section) but do not change the exit status, which is about gameability.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig, config_or_defaults
from gymforge.runtime.gpus import gpu_count
from gymforge.core.records import CheckReport, CoherenceReport, VerificationReport, derive_seed
from gymforge.tasks.metrics import metric_direction, stated_direction
from gymforge.sandbox import Limits
from gymforge.llm.client import make_client
from gymforge.tasks.coherence import check_coherence, teacher_judge
from gymforge.tasks.datacache import cache_root
from gymforge.tasks.episode import EpisodeRunner, sandbox_for
from gymforge.tasks.posttraining import post_training_settings
from gymforge.tasks.mlgym import BENCHMARK_TASKS, load_task_config
from gymforge.tasks.probes import CheckError, measure_baseline, probe_environment
from gymforge.benchmark.suite import SUITES
from gymforge.interop.harbor import HarborTask, is_harbor_folder, leased_sandbox
from gymforge.tasks.harbor import check_harbor_task

__all__ = ["CheckError", "check_task", "priority_metric"]


def priority_metric(task_id: str, metrics: dict[str, float], metric: str | None = None,
                    higher_is_better: bool | None = None, description: str = "") -> tuple[str, bool]:
    """The metric that ranks the task's scores and its direction: as given, else MLGym-Bench's or the built-in
    suite's, else the evaluation's only (or first) metric with the direction the task's description states
    ("lower is better", "minimise"), else the one its name implies (rmse, cost, makespan: lower)."""
    suite = next((s for s in SUITES.values() if task_id in s), None)
    known = BENCHMARK_TASKS.get(task_id) or (suite[task_id][:2] if suite is not None else None)
    if metric is None:
        metric = known[0] if known else next(iter(metrics), "")
    if higher_is_better is None:
        if known and known[0] == metric:
            higher_is_better = known[1]
        else:
            stated = stated_direction(description, metric)
            higher_is_better = stated if stated is not None else metric_direction(metric)[1]
    return metric, higher_is_better


def check_task(task_yaml: Path, root: Path | None = None, out: Path = Path("check-task"), *,
               cfg: GymforgeConfig | None = None, sandbox: str | None = None, seed: int = 0,
               metric: str | None = None, higher_is_better: bool | None = None, gpus: int | None = None,
               limits: Limits | None = None, hidden_columns: dict[str, list[str]] | None = None,
               dataset_cache: Path | None = None, stop_at_first: bool = False,
               coherence: str | None = None, coherence_only: bool = False) -> CheckReport:
    """Install the task at `task_yaml` under `out`, run its baseline, check its text's coherence (`coherence`:
    off, rules or teacher; default rules) and probe its evaluator (`stop_at_first`: stop at
    the first probe that beats the baseline). `coherence_only`: run nothing of the task, check its text against
    its recorded baseline_scores (`_coherence_only`)."""
    base = cfg or GymforgeConfig()
    if sandbox is not None:
        base = base.model_copy(update={"sandbox": base.sandbox.model_copy(update={"backend": sandbox})})
    gpus = gpu_count() if gpus is None else gpus
    if limits is None:
        timeout = load_task_config(task_yaml).effective_training_timeout
        default = Limits.from_config(base.sandbox)
        limits = default.model_copy(update={"cpu_seconds": max(default.cpu_seconds, timeout * (os.cpu_count() or 1))})
    runner = EpisodeRunner(sandbox_for(base, gpus), limits, dataset_cache, gpus=gpus,
                           post_training=post_training_settings(base))
    env = runner.environment(task_yaml, root=root, run_dir=Path(out) / "probe",
                             hidden_columns=hidden_columns)
    if coherence_only:  # nothing is installed: the text against the task's files and recorded scores
        return _coherence_only(env, base, metric, higher_is_better, coherence, seed)
    env.install()
    baseline = measure_baseline(env)
    metric, higher_is_better = priority_metric(env.task.id, baseline[0], metric, higher_is_better,
                                               description=env.task.description)
    # Before the probes, which need the baseline's artefact in the workspace (the check puts it back).
    found = _coherence(env, base, baseline[0] if baseline[1] == "measured" else {}, metric, higher_is_better,
                       coherence, seed)
    report = probe_environment(env, seed=derive_seed(seed, "probes", env.task.id), metric=metric,
                               higher_is_better=higher_is_better, baseline=baseline, stop_at_first=stop_at_first)
    report.coherence = found
    return report


def _coherence(env, cfg: GymforgeConfig, printed: dict[str, float], metric: str, higher_is_better: bool,
               mode: str | None, seed: int, score_submission: bool = True) -> CoherenceReport | None:
    mode = mode or "rules"  # the teacher only on request: a check-task run writes no LLM ledger of its own
    if mode == "off":
        return None
    def judge(context):  # the teacher's client only when the rules found nothing and the prose needs reading
        with make_client(cfg, "check-task") as llm:
            return teacher_judge(llm, derive_seed(seed, "coherence", env.task.id))(context)

    return check_coherence(env, printed, metric=metric, higher_is_better=higher_is_better,
                           score_submission=score_submission, judge=judge if mode == "teacher" else None)


def _coherence_only(env, cfg: GymforgeConfig, metric: str | None, higher_is_better: bool | None, mode: str | None,
                    seed: int) -> CheckReport:
    """The coherence check without running anything of the task: its recorded `baseline_scores` stand for what
    the evaluation prints (for tasks whose baseline needs GPUs or hours), no submission is scored, no probe runs."""
    recorded = dict((env.task.baseline_scores or [{}])[0])
    metric, higher_is_better = priority_metric(env.task.id, recorded, metric, higher_is_better,
                                               description=env.task.description)
    found = _coherence(env, cfg, recorded, metric, higher_is_better, mode, seed, score_submission=False)
    value = next((v for k, v in recorded.items() if k.lower() == metric.lower()), float("nan"))
    return CheckReport(task_id=env.task.id, entrypoint=env.task.task_entrypoint, metric=metric,
                       higher_is_better=higher_is_better, baseline=value, baseline_source="recorded",
                       coherence=found)


def _print_coherence(report: CheckReport) -> None:
    found = report.coherence
    if found is None:
        return
    verdict = "coherent" if found.coherent else f"INCOHERENT ({len(found.findings)} contradictions)"
    print(f"coherence: {verdict}; checked {', '.join(found.checked)}; teacher: {found.teacher}")
    if found.submission is not None:
        outcome = found.submission.get("rejected") or found.submission.get("metrics")
        print(f"  a submission written as the text says ({found.submission['header']}): {outcome}")
    for f in found.findings:
        print(f"  {f.kind:<11} says {f.stated!r}, but {f.actual} [{f.by}, {f.file}]\n              \"{f.evidence}\"")


def main(args: Any) -> None:
    """`gymforge check-task TASK_YAML [--root R] [--json OUT] [--metric M] [--direction D] [--report R] ...`:
    exits 0 only when no probe scores better than the baseline. A Harbor task folder: `harbor_main`."""
    cfg = config_or_defaults(args.config)
    if is_harbor_folder(Path(args.task_yaml)):
        return harbor_main(args, cfg)
    direction = {"higher": True, "lower": False}.get(args.direction) if args.direction else None
    verified = VerificationReport.model_validate_json(Path(args.report).read_text()) if args.report else None
    metric = args.metric or (verified.metric if verified else None)
    if direction is None and verified is not None and verified.metric == metric:
        direction = verified.higher_is_better
    try:
        report = check_task(Path(args.task_yaml), Path(args.root) if args.root else None, Path(args.out), cfg=cfg,
                            sandbox=args.sandbox, seed=args.seed, metric=metric, higher_is_better=direction,
                            gpus=args.gpus, dataset_cache=cache_root(cfg),
                            hidden_columns=verified.hidden_columns if verified else None,
                            coherence=args.coherence, coherence_only=args.coherence_only)
    except CheckError as err:
        sys.exit(f"gymforge check-task: {err}")
    if args.json:
        atomic.write_text(Path(args.json), report.model_dump_json(indent=2))
    if args.coherence_only:
        _print_coherence(report)
        return
    arrow = "higher" if report.higher_is_better else "lower"
    print(f"{report.task_id}: baseline {report.metric} = {report.baseline:g} ({report.baseline_source}, {arrow} is "
          f"better); {len(report.probes)} probes in {report.seconds:.1f} s")
    for o in report.probes:
        verdict = "GAMEABLE" if o.gameable else ("n/a" if not o.applicable else "rejected" if o.rejected else
                                                 "no better")
        detail = o.rejected if o.rejected else f"{report.metric} = {o.score:g}"
        print(f"  {verdict:<9} {o.name:<26} {detail}")
    _print_coherence(report)
    if report.gameable:
        for o in report.gameable_probes:
            print(f"\n{o.name}: {o.description}; wrote {o.submission_file}:\n{o.submission}")
        sys.exit(f"gymforge check-task: {report.task_id} is gameable: {len(report.gameable_probes)} of "
                 f"{len(report.probes)} probes scored better than the baseline")
    print(f"{report.task_id}: every probe rejected or no better than the baseline")


def harbor_main(args: Any, cfg: GymforgeConfig) -> None:
    """`gymforge check-task FOLDER` on a Harbor task folder: one line per check; exits 1 when one fails."""
    folder = Path(args.task_yaml)
    cfg = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"backend": args.sandbox})})
    with leased_sandbox(cfg, HarborTask.read(folder), say=lambda line: print(line, file=sys.stderr)) as sandbox:
        report = check_harbor_task(folder, Path(args.out), sandbox=sandbox, limits=Limits.from_config(cfg.sandbox))
    if args.json:
        atomic.write_text(Path(args.json), report.model_dump_json(indent=2))
    audit = report.harbor
    assert audit is not None
    verdict = lambda ok: "ok  " if ok else "FAIL"  # noqa: E731
    print(f"{report.task_id}: Harbor task folder ({audit.validator}); metric {report.metric}, "
          f"{'higher' if report.higher_is_better else 'lower'} is better; {report.seconds:.1f} s")
    print(f"  {verdict(not audit.schema_problems)} the folder is Harbor's"
          + "".join(f"\n         {p}" for p in audit.schema_problems))
    above = audit.solution is not None and audit.nothing is not None and not report.gameable_probes
    print(f"  {verdict(above)} the solution scores above doing nothing: solution {audit.solution}, "
          f"nothing {audit.nothing}")
    print(f"  {verdict(bool(audit.deterministic))} the verifier is deterministic: {audit.solution} then "
          f"{audit.repeat} on the same files")
    print(f"  {verdict(not audit.leaks)} no answer in environment/" + "".join(f"\n         {x}" for x in audit.leaks))
    for line in audit.not_carried_out:
        print(f"  note: not carried out in gymforge's sandbox (it runs on the sandbox's image; docker_trial builds "
              f"the task's): {line}")
    if audit.failures:
        sys.exit(f"gymforge check-task: {report.task_id}: {len(audit.failures)} check(s) failed:\n  "
                 + "\n  ".join(audit.failures))
    print(f"{report.task_id}: every check passed")
