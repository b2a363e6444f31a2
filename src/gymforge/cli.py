"""The `gymforge` command: one subcommand per pipeline step (what the Snakemake rules call) plus inspection tools."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from gymforge.config import ConfigError, GymforgeConfig, load_config


def _config(args) -> GymforgeConfig:
    return load_config(args.config)


def _cmd_sample_topics(args) -> None:
    from gymforge.stages.topics import sample_batch

    result = sample_batch(_config(args), args.batch, Path(args.previous) if args.previous else None, Path(args.out))
    kept = sum(s.status == "ok" for s in result.slots)
    print(f"{args.batch}: {kept}/{len(result.slots)} topics kept")


def _cmd_propose(args) -> None:
    from gymforge.stages.proposals import propose

    r = propose(_config(args), args.slot, Path(args.batch_file), Path(args.out))
    print(f"{args.slot}: {r.status}" + (f" ({r.reason_code}: {r.reason})" if r.reason else f" dataset={r.dataset and r.dataset['id']}"))


def _cmd_write_configs(args) -> None:
    from gymforge.stages.generation import write_configs

    r = write_configs(_config(args), args.slot, Path(args.proposal), Path(args.out))
    print(f"{args.slot}: {r.status} task={r.task_id} attempts={len(r.attempts)}" + (f" ({r.reason})" if r.reason else ""))


def _cmd_write_code(args) -> None:
    from gymforge.stages.generation import write_starter_code

    r = write_starter_code(_config(args), args.slot, Path(args.proposal), Path(args.configs),
                           Path(args.status_out), Path(args.tree_out))
    print(f"{args.slot}: {r.status} task={r.task_id} attempts={len(r.attempts)}" + (f" ({r.reason})" if r.reason else ""))


def _cmd_verify(args) -> None:
    from gymforge.stages.verification import verify

    r = verify(_config(args), args.slot, Path(args.proposal), Path(args.configs), Path(args.code), Path(args.tree),
               Path(args.report_out), Path(args.env_out))
    print(f"{args.slot}: {r.status} task={r.task_id} iterations={len(r.iterations)} baseline={r.baseline_scores}"
          + (f" ({r.reason})" if r.reason else ""))


def _cmd_rollout_shard(args) -> None:
    from gymforge.stages.rollouts import run_shard

    if not args.verbose:  # one line per request would drown the per-rollout progress lines
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    r = run_shard(_config(args), args.slot, int(args.shard), Path(args.report), Path(args.env), Path(args.out))
    exits: dict[str, int] = {}
    for rollout in r.rollouts:
        status = rollout.trajectory.info.exit_status or "unknown"
        exits[status] = exits.get(status, 0) + 1
    print(f"{args.slot} shard {args.shard}: {r.status} task={r.task_id} rollouts={len(r.rollouts)} "
          f"resumed={r.resumed} exits={exits}" + (f" ({r.reason})" if r.reason else ""))


def _cmd_student_tokenizer(args) -> None:
    from gymforge.tokenizer import build_tokenizer, load_tokenizer

    cfg = _config(args)
    out = build_tokenizer(cfg.train.student, Path(args.out), Path(args.templates), [Path(e) for e in args.envs])
    print(f"{out}: {len(load_tokenizer(out))} tokens ({cfg.train.student})")


def _sft_shards(cfg: GymforgeConfig) -> list[Path]:
    from gymforge.stages.rollouts import shard_ids
    from gymforge.stages.topics import slot_id

    return [cfg.results / "trajectories" / slot_id(i) / f"shard_{k}.json"
            for i in range(cfg.topics.n) for k in shard_ids(cfg)]


def _cmd_sft_dataset(args) -> None:
    from gymforge.sft import build_sft

    cfg = _config(args)
    stats = build_sft(cfg, _sft_shards(cfg), Path(args.tokenizer), jsonl_out=Path(args.jsonl_out),
                      dataset_out=Path(args.dataset_out), rollouts_out=Path(args.rollouts_out),
                      stats_out=Path(args.stats_out), extra_sources=cfg.sft.extra_sources)
    print(f"kept {stats['kept']} of {stats['rollouts']} trajectories from {stats['tasks']} tasks; "
          f"discarded {stats['discarded']}")


def _cmd_import_trajectories(args) -> None:
    from gymforge.importing import import_trajectories

    cfg = _config(args)
    tokenizer = Path(args.tokenizer) if args.tokenizer else cfg.results / "student" / "tokenizer"
    if not tokenizer.is_dir():
        raise ConfigError(f"{tokenizer}: no student tokenizer; build it (snakemake --cores 1 {tokenizer}, or "
                          f"gymforge student-tokenizer --out DIR) or pass --tokenizer DIR")
    stats = import_trajectories(cfg, [Path(d) for d in args.dirs], tokenizer, Path(args.out))
    print(f"kept {stats['kept']} of {stats['rollouts']} trajectories from {stats['tasks']} tasks; "
          f"discarded {stats['discarded']}; {Path(args.out) / 'dataset'} (datasets.load_from_disk), "
          f"{Path(args.out) / 'stats.json'}")


def _cmd_sft_plots(args) -> None:
    from gymforge.plots import plot_sft

    for path in plot_sft(Path(args.stats), Path(args.rollouts), Path(args.kept_out), Path(args.stats_out)):
        print(path)


def _cmd_export_sft(args) -> None:
    from gymforge.sft import export_sft

    results = Path(args.results) if args.results else _config(args).results
    out = export_sft(results, Path(args.dir))
    print(f"{out}: ready for datasets.load_dataset({str(out)!r}) and push_to_hub (see {out / 'README.md'})")


def _cmd_student_base(args) -> None:
    from gymforge.student import build_base

    print(f"student base: {build_base(_config(args), Path(args.tokenizer), Path(args.out))}")


def _cmd_train(args) -> None:
    from gymforge.training import train

    report = train(_config(args), Path(args.dataset), args.base, Path(args.tokenizer), Path(args.out))
    print(f"trained {report.steps} steps on {report.examples} examples: loss {report.first_loss:.3f} -> "
          f"{report.final_loss:.3f}, {report.tokens_per_s:.0f} tokens/s")


def _cmd_eval_runs(args) -> None:
    from gymforge.stages.evaluation import evaluate_task

    runs = [int(k) for k in args.runs.split(",") if k]
    r = evaluate_task(_config(args), args.model, args.task, runs, Path(args.out), checkpoint=args.checkpoint,
                      log_file=Path(args.log) if args.log else None)
    valid = sum(run.valid_submission for run in r.runs)
    print(f"{args.model} on {args.task}: {valid}/{len(r.runs)} runs with a valid submission")


def _cmd_decontamination(args) -> None:
    from gymforge.benchmark.decontamination import ContaminationError, proposal_extra, run

    cfg = _config(args)
    proposals = {Path(p).stem: Path(p) for p in args.proposals}
    trees, extra = [], {}
    for env in map(Path, args.synthesized):  # results/environments/<slot>/verified
        if (env / "mlgym").is_dir():
            trees.append(env / "mlgym")
            if env.parent.name in proposals:
                extra[str(env / "mlgym")] = proposal_extra(proposals[env.parent.name])
    try:
        report = run(cfg.evaluate, trees, Path(args.out), extra)
    except ContaminationError as err:
        sys.exit(f"gymforge: scores on the {cfg.evaluate.benchmark} benchmark would be contaminated:\n{err}")
    print(f"decontamination: {report.checked} synthesized tasks share no dataset or family with the benchmark")


def _cmd_score_table(args) -> None:
    from gymforge.stages.scores import score_table

    table = score_table(_config(args), [Path(r) for r in args.records], aup_out=Path(args.aup_out),
                        scores_out=Path(args.scores_out), replies_out=Path(args.replies_out),
                        violins_out=Path(args.violins_out), bars_out=Path(args.bars_out),
                        profiles_out=Path(args.profiles_out))
    print(table)


def _cmd_run_summary(args) -> None:
    from gymforge.run_report import write_summary

    write_summary(Path(args.results), Path(args.html_out), Path(args.png_out))


def _cmd_aup(args) -> None:
    from gymforge.aup import AupError, run_aup

    try:
        print(run_aup(Path(args.runs_dir), tasks=args.tasks, out_csv=Path(args.out) if args.out else None), end="")
    except AupError as err:
        sys.exit(f"gymforge aup: {err}")


def _cmd_status(args) -> None:
    from gymforge.status import collect, render_table, watch

    if args.watch:
        watch(Path(args.results), interval=args.interval, count=args.count)
        return
    report = collect(Path(args.results))
    print(json.dumps(report, indent=2) if args.json else render_table(report))


def _cmd_show_task(args) -> None:
    from gymforge.show import ShowError, render_task, task_summary

    try:
        summary = task_summary(Path(args.results), args.task)
    except ShowError as err:
        sys.exit(f"gymforge show-task: {err}")
    print(json.dumps(summary, indent=2) if args.json else render_task(summary, full=args.full))


def _cmd_show_trajectory(args) -> None:
    from gymforge import atomic
    from gymforge.show import ShowError, load_episode, render_trajectory_html, render_trajectory_text

    try:
        traj, context = load_episode(Path(args.path), args.rollout)
    except ShowError as err:
        sys.exit(f"gymforge show-trajectory: {err}")
    if args.html:
        atomic.write_text(Path(args.html), render_trajectory_html(traj, context))
        print(f"{args.html}: {len(traj.trajectory)} steps, {traj.info.exit_status or 'unknown'}")
        return
    print(render_trajectory_text(traj, context, max_lines=args.max_lines))


def _cmd_estimate(args) -> None:
    from gymforge.estimate import estimate, has_data, load_configs, measure, render

    cfg = load_configs(args.configfile)
    results = Path(args.results) if args.results else cfg.results
    measured = None
    if not args.defaults and has_data(results):
        measured = measure(results)
    elif args.results and not args.defaults:
        print(f"gymforge estimate: {results} holds no finished run; using the default constants", file=sys.stderr)
    report = estimate(cfg, measured)
    title = " + ".join(args.configfile) if args.configfile else "config.yaml"
    print(json.dumps(report, indent=2) if args.json else render(report, title))


def _cmd_run_task(args) -> None:
    from gymforge.agent.trajectory import read_trajectory
    from gymforge.run_task import run_task

    from gymforge.hub.prefetch import cache_root

    cfg = _config(args) if args.policy == "teacher" else None
    # Hub datasets come from the config's dataset cache; without a config file, from the default one.
    cache = cache_root(cfg or (_config(args) if Path(args.config).is_file() else GymforgeConfig()))
    if args.replay and args.policy != "submit-baseline":
        raise SystemExit("gymforge run-task: --replay replaces --policy; give one of them")
    traj = run_task(Path(args.task_yaml), Path(args.root) if args.root else None, args.policy, Path(args.out),
                    sandbox=args.sandbox, cfg=cfg, seed=args.seed, max_steps=args.max_steps, gpus=args.gpus,
                    dataset_cache=cache, replay=Path(args.replay) if args.replay else None)
    info = read_trajectory(traj).info
    print(f"{traj}: {info.exit_status}; scores {info.score}")
    for flag in info.flags:
        print(f"  flagged at step {flag.step}: {flag.code}: {flag.detail}")


def _cmd_teacher_server(args) -> None:
    from gymforge.offline_teacher.server import serve

    serve(host=args.host, port=args.port)


def _cmd_hub(args) -> None:
    from gymforge.hub import get_hub

    hub = get_hub(_config(args))
    if args.action == "search":
        for card in hub.search(args.query, limit=args.limit):
            print(f"{card.id:<36} {card.downloads:>9}  {', '.join(card.tags[:5])}")
    else:
        print(hub.describe(args.query, n_rows=args.limit).model_dump_json(indent=2))


def _cmd_prefetch_dataset(args) -> None:
    from gymforge.hub import DatasetNotFound, HubUnavailable
    from gymforge.hub.prefetch import MANIFEST, PrefetchError, dataset_key, fetch_hub, prefetch

    cfg = _config(args)
    out = Path(args.out)
    if out.name != MANIFEST or out.parent.name != dataset_key(args.dataset_id):
        sys.exit(f"gymforge: --out must be <cache root>/{dataset_key(args.dataset_id)}/{MANIFEST}, got {out}")
    try:
        m = prefetch(fetch_hub(cfg, args.dataset_id), args.dataset_id, out.parent.parent)
    except (DatasetNotFound, HubUnavailable, PrefetchError) as err:
        sys.exit(f"gymforge: {err}")
    print(f"{m.id}: {m.hub} hub, config {m.config or 'default'}, splits {m.splits}, {m.bytes} bytes -> {out.parent}")


def _cmd_schemas(args) -> None:
    from gymforge.schemas import check_schemas, write_schemas

    if args.check:
        stale = check_schemas(Path(args.out))
        if stale:
            sys.exit("schemas out of date (run `gymforge schemas`): " + ", ".join(stale))
        print("schemas up to date")
    else:
        for path in write_schemas(Path(args.out)):
            print(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymforge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, help: str, config: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        if config:
            p.add_argument("--config", default="config.yaml", help="config YAML/JSON (default: config.yaml)")
        p.set_defaults(func=func)
        return p

    p = command("sample-topics", _cmd_sample_topics, "stage 3.1: sample one batch of topics")
    p.add_argument("--batch", required=True)
    p.add_argument("--previous", default="")
    p.add_argument("--out", required=True)

    p = command("propose", _cmd_propose, "stage 3.2: propose a dataset-grounded task for one topic slot")
    p.add_argument("--slot", required=True)
    p.add_argument("--batch-file", required=True)
    p.add_argument("--out", required=True)

    p = command("write-configs", _cmd_write_configs, "stage 3.3a: write and validate the MLGym configs")
    p.add_argument("--slot", required=True)
    p.add_argument("--proposal", required=True)
    p.add_argument("--out", required=True)

    p = command("write-code", _cmd_write_code, "stage 3.3b: write and validate the starter code, emit the MLGym tree")
    p.add_argument("--slot", required=True)
    p.add_argument("--proposal", required=True)
    p.add_argument("--configs", required=True)
    p.add_argument("--status-out", required=True)
    p.add_argument("--tree-out", required=True)

    p = command("verify", _cmd_verify, "stage 3.4: verify one task (baseline, evaluation, teacher episode, debug loop)")
    for flag in ("--slot", "--proposal", "--configs", "--code", "--tree", "--report-out", "--env-out"):
        p.add_argument(flag, required=True)

    p = command("rollout-shard", _cmd_rollout_shard, "stage 3.5: run (or resume) one shard of teacher rollouts of a task")
    for flag in ("--slot", "--shard", "--report", "--env", "--out"):
        p.add_argument(flag, required=True)

    p = command("student-tokenizer", _cmd_student_tokenizer, "save the student's tokenizer (offline: train one locally)")
    p.add_argument("--templates", default="templates")
    p.add_argument("--envs", nargs="*", default=[], help="verified environment folders (offline corpus)")
    p.add_argument("--out", required=True)

    p = command("sft-dataset", _cmd_sft_dataset, "stage 3.6: filter the rollouts into the SFT dataset and its stats")
    for flag in ("--tokenizer", "--jsonl-out", "--dataset-out", "--rollouts-out", "--stats-out"):
        p.add_argument(flag, required=True)

    p = command("import-trajectories", _cmd_import_trajectories, "SFT examples from MLGym run folders "
                "(<task>.traj + results.json) or gymforge shards, through the SFT filters")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="directories (searched recursively) or files")
    p.add_argument("--out", required=True, help="writes OUT/dataset, OUT/train.jsonl, OUT/rollouts.jsonl, "
                   "OUT/stats.json")
    p.add_argument("--tokenizer", default=None, help="the student's tokenizer (default: "
                   "<results_dir>/student/tokenizer of --config)")

    p = command("sft-plots", _cmd_sft_plots, "plots of the trajectory stage (kept per task; Figure-4-style stats)",
                config=False)
    for flag in ("--stats", "--rollouts", "--kept-out", "--stats-out"):
        p.add_argument(flag, required=True)

    p = command("student-base", _cmd_student_base, "build the student's base model (offline: a tiny random-init Qwen3)")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)

    p = command("train", _cmd_train, "stage 3.7: SFT of the student with TRL (run it with accelerate for several GPUs)")
    for flag in ("--dataset", "--base", "--tokenizer", "--out"):
        p.add_argument(flag, required=True)

    p = command("eval-runs", _cmd_eval_runs, "stage 3.8: run (or resume) one model's runs on one benchmark task")
    for flag in ("--model", "--task", "--runs", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--checkpoint", default=None, help="folder or hub id a served model is loaded from")
    p.add_argument("--log", default=None, help="the job's log; a served model logs to <log stem>.server.log beside it")

    p = command("decontamination", _cmd_decontamination,
                "fail if a synthesized task shares a dataset or task family with the benchmark")
    p.add_argument("--synthesized", nargs="*", default=[], help="verified environment folders")
    p.add_argument("--proposals", nargs="*", default=[], help="the slots' proposal records (topic and dataset text)")
    p.add_argument("--out", required=True)

    p = command("score-table", _cmd_score_table, "stage 3.8: Best Attempt / Best Submission, AUP and plots")
    p.add_argument("--records", nargs="+", required=True)
    for flag in ("--aup-out", "--scores-out", "--replies-out", "--violins-out", "--bars-out", "--profiles-out"):
        p.add_argument(flag, required=True)

    p = command("run-summary", _cmd_run_summary, "funnel, reasons and LLM usage as report pages", config=False)
    for flag in ("--results", "--html-out", "--png-out"):
        p.add_argument(flag, required=True)

    p = command("aup", _cmd_aup, "AUP of a directory of MLGym-format run folders (<model>__<task>__*/results.json)",
                config=False)
    p.add_argument("runs_dir")
    p.add_argument("--tasks", default="mlgym", help="`mlgym` (MLGym's 13 tasks) or a YAML/JSON file "
                   "{task_id: {metric, higher_is_better}}")
    p.add_argument("--out", default=None, help="also write the CSV here")

    p = command("export-sft", _cmd_export_sft, "export the SFT dataset as a folder for load_dataset / push_to_hub")
    p.add_argument("dir")
    p.add_argument("--results", default=None, help="results directory (default: results_dir of --config)")

    p = command("status", _cmd_status, "funnel of a results directory", config=False)
    p.add_argument("--results", default="results")
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", action="store_true", help="redraw the funnel until interrupted, with rates and ETAs")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between redraws with --watch (default 5)")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after this many tables")

    p = command("show-task", _cmd_show_task, "summary of one synthesized task: topic, configs, verification, "
                "trajectories, files", config=False)
    p.add_argument("task", help="topic slot (t0003) or task id")
    p.add_argument("--results", default="results")
    p.add_argument("--full", action="store_true", help="whole files and error messages, every rollout")
    p.add_argument("--json", action="store_true")

    p = command("show-trajectory", _cmd_show_trajectory, "render one episode: a .traj file, a rollout shard "
                "(--rollout K) or a run folder", config=False)
    p.add_argument("path")
    p.add_argument("--rollout", type=int, default=None, help="rollout index within a shard (default: its first)")
    p.add_argument("--html", default=None, metavar="OUT", help="write a self-contained HTML page instead")
    p.add_argument("--max-lines", type=int, default=15, help="lines shown per thought/observation (default 15)")

    p = command("estimate", _cmd_estimate, "project LLM calls, tokens, cost, GPU- and CPU-hours of a config, "
                "running nothing", config=False)
    p.add_argument("--configfile", nargs="+", action="extend", default=[], metavar="F",
                   help="config files merged over ./config.yaml in order, as with snakemake --configfile")
    p.add_argument("--results", default=None, help="finished run to measure per-item averages from "
                   "(default: the config's results_dir when it has data)")
    p.add_argument("--defaults", action="store_true", help="ignore any finished run: default constants only")
    p.add_argument("--json", action="store_true")

    p = command("run-task", _cmd_run_task, "run one agent episode on any MLGym-format task")
    p.add_argument("task_yaml")
    p.add_argument("--root", default=None, help="MLGym-layout root (default: two levels above configs/tasks/)")
    p.add_argument("--policy", choices=["submit-baseline", "teacher"], default="submit-baseline")
    p.add_argument("--replay", metavar="FILE", default=None,
                   help="replay the replies in FILE (a JSON list of reply strings, or a gymforge/MLGym .traj) "
                   "instead of asking a model; when they run out the episode auto-submits")
    p.add_argument("--out", default="run-task")
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--gpus", type=int, default=None, help="GPUs for LM tasks (default: detect)")

    p = command("teacher-server", _cmd_teacher_server, "serve the offline teacher as an OpenAI-compatible endpoint", config=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)

    p = command("hub", _cmd_hub, "search or describe datasets on the configured hub")
    p.add_argument("action", choices=["search", "describe"])
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10)

    p = command("prefetch-dataset", _cmd_prefetch_dataset,
                "fetch one hub dataset into the host cache that sandboxes mount read-only")
    p.add_argument("--dataset-id", required=True, help="hub id, owner/name")
    p.add_argument("--out", required=True, help="the entry's manifest: <cache root>/<owner--name>/manifest.json")

    p = command("schemas", _cmd_schemas, "regenerate (or --check) the JSON schemas from the Pydantic models", config=False)
    p.add_argument("--out", default="schemas")
    p.add_argument("--check", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    from gymforge import job

    # `gymforge --log <file> <command> ...`: a Snakemake job (log attempts, scratch dir, failure record).
    argv, log = job.split_log_option(sys.argv[1:] if argv is None else argv)
    with job.running(log):
        _main(argv)


def _main(argv: list[str]) -> None:
    if argv and argv[0] == "with-gpus":  # before argparse: everything after `--` is the command
        from gymforge import gpus

        sys.exit(gpus.main(argv[1:]))
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gymforge.benchmark.suite import BenchmarkError
    from gymforge.environment import BaselineFailed, InstallError, TaskUnsupported
    from gymforge.importing import TrajectoryImportError
    from gymforge.llm import BudgetExceeded
    from gymforge.mlgym import MLGymConfigError
    from gymforge.sandbox import SandboxError

    try:
        args.func(args)
    except ConfigError as err:
        sys.exit(str(err))
    except (BenchmarkError, BudgetExceeded, BaselineFailed, InstallError, TaskUnsupported, MLGymConfigError, SandboxError,
            TrajectoryImportError) as err:
        sys.exit(f"gymforge: {err}")


if __name__ == "__main__":
    main()
