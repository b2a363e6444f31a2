"""The `gymforge` command: one verb per pipeline step, named as its Snakemake rule, plus the tools around them.

A step's verb, flags and help come from its function's signature (`STEPS`): rule `eval_runs` runs
`gymforge eval-runs`, which calls `gymforge.stages.evaluation.eval_runs`; parameter `report_out` is flag
`--report-out`, `cfg` is `--config`. The tools (status, show-*, estimate, run-task, ...) keep hand-written
parsers; the function that runs each (`TOOLS`) is imported, like a step's, only when it runs."""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import sys
from pathlib import Path
from typing import Any, Callable

from gymforge.core import configview, plugins
from gymforge.runtime import gpus, job
from gymforge.core.config import ConfigError, GymforgeConfig, config_or_defaults
from gymforge.hub import get_hub


# Every `--config`: without it, ./config.yaml when there is one, else the models' defaults (config_or_defaults).
CONFIG_HELP = "config YAML/JSON (default: ./config.yaml when present, else the built-in defaults)"


def _config(args) -> GymforgeConfig:
    return config_or_defaults(args.config)


# ---- pipeline steps: verb -> the function its rule runs ------------------------------------------------

STEPS: dict[str, tuple[str, str]] = {  # verb: (module:function, help)
    "topic-batch": ("gymforge.stages.topics:topic_batch", "topics: sample one batch of topics"),
    "proposal": ("gymforge.stages.proposals:proposal", "proposals: propose a dataset-grounded task for one topic slot"),
    "fetch-dataset": ("gymforge.stages.datasets:fetch_dataset", "fetch one hub dataset into the host cache that sandboxes mount read-only"),
    "prefetch-model": ("gymforge.stages.datasets:prefetch_model", "fetch one hub model (the student's base) into the model cache jobs load it from"),
    "task-configs": ("gymforge.stages.generation:task_configs", "generation (configs): write and validate the MLGym configs"),
    "starter-code": ("gymforge.stages.generation:starter_code", "generation (starter code): write and validate the starter code, emit the MLGym tree"),
    "verify-environment": ("gymforge.stages.verification:verify_environment", "verification: verify one task (baseline, evaluation, teacher episode, debug loop)"),
    "micro-task": ("gymforge.stages.micro:micro_task", "micro-scale variant of one verified task: subsample, verify (docs/rl.md)"),
    "rollout-shard": ("gymforge.stages.rollouts:rollout_shard", "rollouts: run (or resume) one shard of teacher rollouts of a task"),
    "interface-comparison": ("gymforge.stages.interface_comparison:interface_comparison", "the agent interfaces compared on the same tasks: valid submissions, improvement, failed actions, train-eval iterations"),
    "student-tokenizer": ("gymforge.stages.sft:student_tokenizer", "save the student's tokenizer (offline: train one locally)"),
    "sft-dataset": ("gymforge.stages.sft:sft_dataset", "SFT data: filter the rollouts into the SFT dataset and its stats"),
    "sft-plots": ("gymforge.stages.sft:sft_plots", "plots of the trajectory stage (kept per task; Figure-4-style stats)"),
    "student-base": ("gymforge.stages.training:student_base", "build the student's base model (offline: a tiny random-init Qwen3)"),
    "train-student": ("gymforge.stages.training:train_student", "training: SFT of the student with TRL (run it with accelerate for several GPUs)"),
    "train-rl": ("gymforge.stages.rl:train_rl", "RL: on-policy RL (GRPO, duration-aware) of the SFT student on micro tasks"),
    "rl-plot": ("gymforge.stages.rl:rl_plot", "the RL reward curve (curve.json) as a figure for the report"),
    "decontamination": ("gymforge.stages.evaluation:decontamination", "check synthesized tasks against the benchmark's datasets and task families (drop or fail: decontamination.on_overlap)"),
    "eval-runs": ("gymforge.stages.evaluation:eval_runs", "evaluation: run (or resume) one model's runs on one benchmark task"),
    "check-benchmark-task": ("gymforge.stages.evaluation:check_benchmark_task", "probe one benchmark task's evaluator with degenerate submissions (gymforge check-task)"),
    "score-table": ("gymforge.stages.scores:score_table", "evaluation: Best Attempt / Best Submission, AUP and plots"),
    "run-summary": ("gymforge.stages.scores:run_summary", "funnel, reasons and LLM usage as report pages"),
    "harbor-task": ("gymforge.interop.harbor:harbor_task", "one verified environment as a Harbor task folder (target harbor; docs/interop.md)"),
}

# Annotation (as written, `from __future__ import annotations`) -> argparse keywords. Parameters of other
# types (test hooks such as `llm=`, `callbacks=`) must have defaults and are not flags.
_FLAG_TYPES: dict[str, dict[str, Any]] = {
    "Path": {"type": Path}, "str | Path": {"type": Path}, "Path | str": {"type": Path},
    "Path | None": {"type": Path, "nargs": "?"}, "str": {"type": str}, "str | None": {"type": str},
    "int": {"type": int}, "float": {"type": float}, "bool": {"action": "store_true"},
    "list[Path]": {"type": Path, "nargs": "*"}, "list[Path] | None": {"type": Path, "nargs": "*"}, "list[int]": {"type": int, "nargs": "*"},
    "list[str]": {"type": str, "nargs": "*"},
}


def _step_function(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _add_step(sub: Any, verb: str, target: str, help: str) -> None:
    """The step's entry in `gymforge --help`; its flags come from the function when it runs (`_step_parser`),
    so building the parser imports no stage module."""
    p = sub.add_parser(verb, help=help, add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _run_step(verb, target, args.rest))


def _step_parser(verb: str, function: Callable[..., Any]) -> argparse.ArgumentParser:
    doc = inspect.getdoc(function) or ""
    p = argparse.ArgumentParser(prog=f"gymforge {verb}", description=doc.split("\n\n")[0])
    for param in inspect.signature(function).parameters.values():
        if param.name == "cfg":
            p.add_argument("--config", default=None, help=CONFIG_HELP)
            continue
        flag = "--" + param.name.replace("_", "-")
        kind = _FLAG_TYPES.get(str(param.annotation).replace("'", ""))
        if kind is None:
            if param.default is inspect.Parameter.empty:
                raise TypeError(f"{function.__qualname__}: parameter {param.name} ({param.annotation}) has no flag type")
            continue
        if param.default is inspect.Parameter.empty:
            p.add_argument(flag, dest=param.name, required=kind.get("nargs") != "*", default=[], **kind)
        else:
            p.add_argument(flag, dest=param.name, default=param.default, **kind)
    return p


def _run_step(verb: str, target: str, argv: list[str]) -> None:
    function = _step_function(target)
    args = vars(_step_parser(verb, function).parse_args(argv))
    if "config" in args:
        # Run by its rule: only the config sections the rule declares (gymforge.core.configview).
        args["cfg"] = configview.for_step(config_or_defaults(args.pop("config")), verb.replace("-", "_"))
    _print_result(function(**args))


def _print_result(result: Any) -> None:
    """A step's return value as the line(s) its job log shows."""
    if result is None:
        return
    if isinstance(result, (list, tuple)):
        for r in result:
            _print_result(r)
        return
    if callable(summary := getattr(result, "summary", None)):
        print(summary())
        return
    dump = getattr(result, "model_dump", None)
    if dump is None:
        print(result)
        return
    fields = {k: v for k, v in dump().items() if isinstance(v, (str, int, float)) and v is not None}
    head = fields.pop("item", None) or fields.pop("batch", None) or type(result).__name__
    keep = ("status", "task_id", "reason_code", "reason", "steps", "examples", "final_loss", "resumed")
    print(f"{head}: " + " ".join(f"{k}={fields[k]}" for k in keep if k in fields))


# ---- tools: verb -> the function that runs it with the parsed arguments ------------------------------------

# Like a step's module, a tool's is imported only when it runs: `gymforge --help` loads none of them (each costs
# 40 ms to 1 s: the LLM client, pandas, matplotlib), and a command loads only its own.
TOOLS: dict[str, str] = {
    "import-trajectories": "gymforge.tools.import_trajectories:main",
    "aup": "gymforge.benchmark.aup:main",
    "export-sft": "gymforge.tools.import_trajectories:export_main",
    "export-tokens": "gymforge.tools.export_tokens:main",
    "status": "gymforge.tools.status:main",
    "show-task": "gymforge.tools.show:task_main",
    "show-trajectory": "gymforge.tools.show:trajectory_main",
    "estimate": "gymforge.tools.estimate:main",
    "run-task": "gymforge.tools.run_task:main",
    "check-task": "gymforge.tools.check_task:main",
    "schemas": "gymforge.tools.schemas:main",
    "preflight": "gymforge.tools.preflight:main",
    "export-harbor": "gymforge.tools.harbor:export_main",
    "harbor-run": "gymforge.tools.harbor:run_main",
}


def _run_tool(args: argparse.Namespace) -> None:
    try:
        _step_function(TOOLS[args.command])(args)
    except FileNotFoundError as err:  # almost always a path given on the command line: its name says it all
        sys.exit(f"gymforge {args.command}: " + (f"{err.filename}: no such file or directory" if err.filename
                                                 else str(err)))


def _cmd_teacher_server(args) -> None:
    plugins.load("offline-teacher-server")(host=args.host, port=args.port, endpoint=args.endpoint,
                                           request_log=args.request_log)


def _cmd_hub(args) -> None:
    hub = get_hub(_config(args))
    if args.action == "search":
        for card in hub.search(args.query, limit=args.limit):
            print(f"{card.id:<36} {card.downloads:>9}  {', '.join(card.tags[:5])}")
    else:
        print(hub.describe(args.query, n_rows=args.limit).model_dump_json(indent=2))


# long: every tool command's arguments in one flat declaration, read top to bottom (STEPS adds the steps)
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymforge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, help: str, config: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        if config:
            p.add_argument("--config", default=None, help=CONFIG_HELP)
        p.set_defaults(func=func)
        return p

    for verb, (target, help) in STEPS.items():
        _add_step(sub, verb, target, help)

    p = command("import-trajectories", _run_tool, "SFT examples from MLGym run folders "
                "(<task>.traj + results.json) or gymforge shards, through the SFT filters")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="directories (searched recursively) or files")
    p.add_argument("--out", required=True, help="writes OUT/dataset, OUT/train.jsonl, OUT/rollouts.jsonl, "
                   "OUT/stats.json")
    p.add_argument("--tokenizer", default=None, help="the student's tokenizer (default: "
                   "<results_dir>/student/tokenizer of --config)")
    p.add_argument("--unit", choices=["auto", "request", "conversation"], default=None,
                   help="example unit: one example per kept trajectory (conversation) or per teacher reply "
                   "(request); default: sft.example_unit of --config (auto)")

    p = command("aup", _run_tool, "AUP of a directory of MLGym-format run folders (<model>__<task>__*/results.json)",
                config=False)
    p.add_argument("runs_dir")
    p.add_argument("--tasks", default="mlgym", help="`mlgym` (MLGym's 13 tasks) or a YAML/JSON file "
                   "{task_id: {metric, higher_is_better}}")
    p.add_argument("--out", default=None, help="also write the CSV here")

    p = command("export-sft", _run_tool, "export the SFT dataset as a folder for load_dataset / push_to_hub")
    p.add_argument("dir")
    p.add_argument("--results", default=None, help="results directory (default: results_dir of --config)")

    p = command("export-tokens", _run_tool, "export served models' replies as token ids, log-probs and masks "
                "(RL data for TRL / verl)")
    p.add_argument("dir")
    p.add_argument("--results", default=None, help="results directory (default: results_dir of --config)")

    p = command("status", _run_tool, "funnel of a results directory", config=False)
    p.add_argument("--results", default="results")
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", action="store_true", help="redraw the funnel until interrupted, with rates and ETAs")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between redraws with --watch (default 5)")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after this many tables")

    p = command("show-task", _run_tool, "summary of one synthesized task: topic, configs, verification, "
                "trajectories, files", config=False)
    p.add_argument("task", help="topic slot (t0003) or task id")
    p.add_argument("--results", default="results")
    p.add_argument("--full", action="store_true", help="whole files and error messages, every rollout")
    p.add_argument("--json", action="store_true")

    p = command("show-trajectory", _run_tool, "render one episode: a .traj file, a rollout shard "
                "(--rollout K) or a run folder", config=False)
    p.add_argument("path")
    p.add_argument("--rollout", type=int, default=None, help="rollout index within a shard (default: its first)")
    p.add_argument("--html", default=None, metavar="OUT", help="write a self-contained HTML page instead")
    p.add_argument("--max-lines", type=int, default=15, help="lines shown per thought/observation (default 15)")

    p = command("estimate", _run_tool, "project LLM calls, tokens, cost, GPU- and CPU-hours of a config, "
                "running nothing", config=False)
    p.add_argument("--configfile", nargs="+", action="extend", default=[], metavar="F",
                   help="config files layered in order (each over the files its `base:` names; none: ./config.yaml), "
                   "as with snakemake --configfile")
    p.add_argument("--results", default=None, help="finished run to measure per-item averages from "
                   "(default: the config's results_dir when it has data)")
    p.add_argument("--defaults", action="store_true", help="ignore any finished run: default constants only")
    p.add_argument("--reasoning-ratio", type=float, default=None, metavar="X",
                   help="hidden reasoning tokens per visible completion token of the teacher, billed as output "
                   "(default: the pilot's, else MLGym's o-series runs for a reasoning teacher, else 0)")
    p.add_argument("--json", action="store_true")

    p = command("run-task", _run_tool, "run one agent episode on any MLGym-format task or Harbor task folder")
    p.add_argument("task_yaml", help="an MLGym task YAML, or a Harbor task folder (task.toml, tests/test.sh, ...)")
    p.add_argument("--root", default=None, help="MLGym-layout root (default: two levels above configs/tasks/)")
    p.add_argument("--policy", choices=["submit-baseline", "teacher"], default="submit-baseline")
    p.add_argument("--replay", metavar="FILE", default=None,
                   help="replay the replies in FILE (a JSON list of reply strings, or a gymforge/MLGym .traj) "
                   "instead of asking a model; when they run out the episode auto-submits")
    p.add_argument("--out", default="run-task")
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--interface", choices=["cli", "workflow"], default="cli",
                   help="workflow: a post-training task's skills beside the shell (docs/post-training.md)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs for LM tasks (default: detect)")
    p.add_argument("--hidden-columns", default=None, metavar="JSON",
                   help='the columns hidden from the agent per split, as verification hides them (e.g. '
                   '\'{"test": ["label"]}\'; a results directory\'s rows carry them: docs/interop.md)')

    p = command("check-task", _run_tool, "check a task's text against what it does (coherence) and probe its "
                "evaluator with knowledge-free degenerate submissions; exits 0 only when no probe scores better than "
                "the baseline (a Harbor task folder: its checks, docs/interop.md)")
    p.add_argument("task_yaml", help="an MLGym task YAML, or a Harbor task folder (task.toml, tests/test.sh, ...)")
    p.add_argument("--root", default=None, help="MLGym-layout root (default: two levels above configs/tasks/)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the report (every probe, its submission, "
                   "its score) as JSON")
    p.add_argument("--out", default="check-task", help="run directory (the installed task)")
    p.add_argument("--metric", default=None, help="the metric that ranks scores (default: the benchmark's, or the "
                   "evaluation's only metric)")
    p.add_argument("--direction", choices=["higher", "lower"], default=None,
                   help="whether higher or lower is better (default: known tasks' own, else what the task's "
                   "description says, else read off the name)")
    p.add_argument("--report", default=None, metavar="REPORT_JSON",
                   help="a verified task's results/environments/<slot>/report.json: its held-out columns are "
                   "withheld as in its episodes, and its metric and direction are used")
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpus", type=int, default=None, help="GPUs for LM tasks (default: detect)")
    p.add_argument("--coherence", choices=["off", "rules", "teacher"], default=None,
                   help="check the task's text against its evaluator, config and data: the rules only, or the "
                   "teacher's reading of the prose too (default: rules; teacher uses the config's llm.teacher and "
                   "books its call in the config's results_dir)")
    p.add_argument("--coherence-only", action="store_true",
                   help="check only the text's coherence, against the task's recorded baseline_scores: nothing of "
                   "the task runs (for tasks whose baseline needs GPUs or hours)")

    p = command("preflight", _run_tool, "check what this node allows before jobs run here (a compute node): the sandbox "
                "without root, cgroups, CUDA under the sandbox's limits, network only where it should be, the "
                "ledger's locks; one line per check, exit 1 when one fails")
    p.add_argument("--json", action="store_true")

    p = command("export-harbor", _run_tool, "write every verified environment as a Harbor task folder "
                "(docs/interop.md); a rerun rewrites nothing that did not change")
    p.add_argument("out")
    p.add_argument("--results", default=None, help="results directory (default: results_dir of --config)")
    p.add_argument("--micro", action="store_true", help="the micro variants (results/micro) instead")
    p.add_argument("--base-image", default="python:3.11-slim", help="the image environment/ and tests/ build FROM "
                   "(a public one, or one built locally such as gymforge-sandbox:latest)")

    p = command("harbor-run", _run_tool, "run a Harbor task folder in gymforge's sandbox: solution/solve.sh (or "
                "nothing, --nop) as the agent, then tests/test.sh; prints the rewards")
    p.add_argument("folder")
    p.add_argument("--work", default="harbor-run", help="run directory")
    p.add_argument("--nop", action="store_true", help="the agent does nothing (the floor)")

    p = command("teacher-server", _cmd_teacher_server, "serve the offline teacher as an OpenAI-compatible endpoint", config=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", choices=["chat", "reasoning"], default="chat",
                   help="`reasoning`: behave as an OpenAI reasoning model (llm.teacher.offline_endpoint)")
    p.add_argument("--request-log", default=None, metavar="FILE",
                   help="append one JSON line per chat completion: the request's fields and sampling settings (never "
                   "its messages), the answer's status and usage")

    p = command("hub", _cmd_hub, "search or describe datasets on the configured hub")
    p.add_argument("action", choices=["search", "describe"])
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10)

    p = command("schemas", _run_tool, "regenerate (or --check) the JSON schemas and the key table of "
                "docs/configuration.md from the Pydantic models", config=False)
    p.add_argument("--out", default="schemas")
    p.add_argument("--docs", default="docs/configuration.md", help="the doc whose key table is generated too")
    p.add_argument("--check", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    # `gymforge --log <file> <command> ...`: a Snakemake job (log attempts, scratch dir, failure record).
    argv, log = job.split_log_option(sys.argv[1:] if argv is None else argv)
    with job.running(log):
        _main(argv)


def _main(argv: list[str]) -> None:
    if argv and argv[0] == "with-gpus":  # before argparse: everything after `--` is the command
        sys.exit(gpus.main(argv[1:]))
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # deferred: the error types' modules cost `gymforge --help` ~120 ms (every command loads them here)
    from gymforge.tools.errors import PLAIN_ERRORS

    try:
        args.func(args)
    except ConfigError as err:
        sys.exit(str(err))
    except configview.UndeclaredConfigRead as err:
        sys.exit(str(err))
    except PLAIN_ERRORS as err:
        sys.exit(f"gymforge: {err}")


if __name__ == "__main__":
    main()
