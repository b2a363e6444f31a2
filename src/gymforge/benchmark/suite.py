"""The benchmark the models are scored on (docs/scores.md, Benchmark): gymforge's built-in suite, its built-in
post-training suite or MLGym's 13 tasks.

The built-in suite is a tree in MLGym's layout under `tasks/` (`configs/tasks/<id>.yaml`,
`configs/datasets/<name>.yaml`, `data/<id>/...`) of tasks written for this project: they run offline
on CPU in seconds, and their families and data are disjoint from what synthesis produces (tabular
classification, regression and forecasting, tabular model submission, matrix games, bargaining and
packing heuristics on scikit-learn, palmerpenguins, statsmodels and vega datasets). Their data is
synthetic, generated from fixed seeds by `gymforge.benchmark.generate`.

Harbor task folders (`evaluate.harbor`, docs/interop.md) join any of these: each is a task whose id is its folder's
name, run by gymforge's agent in its sandbox and scored by its own verifier (`tests/test.sh`), with the GPUs its
task.toml declares.

The built-in post-training suite (`posttraining`, docs/post-training.md) lives in the same tree: post-train
SmolLM2-135M-Instruct on CPU so that a held-out, generation-scored evaluation improves (penguin species, ISO 8601
dates, metric unit conversions); its data is made by seeded scripts under `scripts/`.

Every task carries what decontamination needs to keep synthesized tasks away from it: a `family`, the
`keywords` that name that family in another task's text, and the identities of its `datasets`.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict

from gymforge.core import atomic
from gymforge.core.config import EvaluateConfig
from gymforge.tasks.mlgym import (
    BENCHMARK_TASKS,
    Entrypoint,
    load_dataset_config,
    load_task_config,
)
from gymforge.tasks.datacache import MANIFEST, entry_dir
from gymforge.tasks.harbor import HarborTask, folder_digest, is_harbor_folder
from gymforge.tasks import prepare

BenchmarkName = Literal["builtin", "posttraining", "mlgym", "harbor"]


class BenchmarkError(ValueError):
    """The benchmark cannot be loaded as configured; the message says what is wrong and what exists."""


class BenchmarkTask(BaseModel):
    """One task of a benchmark, with the facts scoring and decontamination need."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    task_yaml: Path  # a Harbor task's folder (`benchmark` "harbor")
    root: Path  # the MLGym-layout tree task_yaml's paths resolve against (a Harbor task: its folder)
    entrypoint: Entrypoint | Literal["harbor"]
    metric: str  # the priority metric (a key of the evaluation's JSON)
    higher_is_better: bool
    family: str  # a short label of the task family
    keywords: list[str]  # phrases that identify the family in another task's id, name or description
    datasets: list[str]  # dataset identities: Hugging Face ids or names of the data source
    benchmark: BenchmarkName = "builtin"
    hub_datasets: list[str] = []  # ids the task loads from the hub (fetched on the host before it runs)
    local_data: list[str] = []  # its local datasets' data_path, relative to root
    gpus: int = 0  # GPUs a run needs (MLGYM_GPUS); its eval job declares them


class _Meta(NamedTuple):
    metric: str
    higher_is_better: bool
    family: str
    keywords: tuple[str, ...]
    datasets: tuple[str, ...]


# What decontamination knows of each task (family, keywords, dataset identities): data, in suite.yaml.
_META = yaml.safe_load(resources.files(__package__).joinpath("suite.yaml").read_text(encoding="utf-8"))


def _suite(name: str) -> dict[str, _Meta]:
    return {task_id: _Meta(m["metric"], m["higher_is_better"], m["family"], tuple(m["keywords"]), tuple(m["datasets"]))
            for task_id, m in _META[name].items()}


# The built-in suites, in the order they are run and reported: both live in the tree `builtin_root()`.
BUILTIN: dict[str, _Meta] = _suite("builtin")
POSTTRAINING: dict[str, _Meta] = _suite("posttraining")
SUITES: dict[str, dict[str, _Meta]] = {"builtin": BUILTIN, "posttraining": POSTTRAINING}

# MLGym-Bench's 13 tasks: metric and direction come from gymforge.tasks.mlgym.BENCHMARK_TASKS.
MLGYM: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    task_id: (m["family"], tuple(m["keywords"]), tuple(m["datasets"])) for task_id, m in _META["mlgym"].items()
}


# MLGym-Bench tasks that need a GPU, and why. The others run on CPU: the games, 3SATTime and
# regressionKaggleHousePrice; Cifar10 and Fashion-MNIST train their small CNN baselines on CPU too, once their
# hub data is fetched.
MLGYM_GPUS: dict[str, tuple[int, str]] = {
    "languageModelingFineWeb": (1, "an LMSubmissionTasks task: its training and evaluation run under torchrun on CUDA"),
    "imageCaptioningCOCO": (1, "an image-captioning model trained on COCO within its training timeout"),
    "naturalLanguageInferenceMNLI": (1, "BERT fine-tuning on MultiNLI within its training timeout"),
    "rlBreakoutMinAtar": (1, "its requirements install jax[cuda12] (gymnax PPO)"),
    "rlMetaMazeMisc": (1, "its requirements install jax[cuda12] (gymnax PPO)"),
    "rlMountainCarContinuous": (1, "its requirements install jax[cuda12] (gymnax PPO)"),
}


class TaskUnavailable(BenchmarkError):
    """A benchmark task cannot run here as things stand; the message names what is missing and how to get it."""


def unmet_needs(task: BenchmarkTask, dataset_cache: Path | str, gpus: int) -> list[str]:
    """What `task` needs that is not here: local data, unfetched hub datasets, fewer than `task.gpus` GPUs."""
    problems = []
    for path in task.local_data:
        if not (task.root / path).exists():
            scripts = prepare.helpers(task.root, task.id)
            how = (f"MLGym generates it with {', '.join(str(h.relative_to(task.root)) for h in scripts)}" if scripts
                   else "MLGym does not ship it: put the task's data there")
            problems.append(f"its local data {path} is not in {task.root} ({how})")
    unfetched = [i for i in task.hub_datasets if not (entry_dir(dataset_cache, i) / MANIFEST).is_file()]
    if unfetched:
        problems.append(
            f"it loads {', '.join(unfetched)} from the Hugging Face hub, not fetched into {dataset_cache}: run "
            f"`snakemake datasets` (it fetches them from the hub; needs network access) before the benchmark, or "
            f"only these: `snakemake {' '.join(str(entry_dir(dataset_cache, i) / MANIFEST) for i in unfetched)}`"
        )
    if gpus < task.gpus:
        why = MLGYM_GPUS.get(task.id, (0, {"mlgym": "its config says so", "harbor": "its task.toml declares them"}.get(
            task.benchmark, "evaluate.task_gpus")))[1]
        problems.append(
            f"it needs {task.gpus} GPU(s) ({why}) and this job sees {gpus}: run it on a GPU host with "
            f"`snakemake --resources gpu=N`, or leave it out with evaluate.tasks"
        )
    return problems


def require_runnable(task: BenchmarkTask, dataset_cache: Path | str, gpus: int, *, sandbox=None, limits=None) -> None:
    """Raise TaskUnavailable naming everything `task` is missing here (see `unmet_needs`). With a `sandbox`,
    local data that MLGym makes with a helper script is made first (`tasks.prepare`)."""
    if sandbox is not None:
        try:  # what every install of a task does first (TaskEnvironment.install)
            prepare.prepare_task_data(task.root, task.id, task.local_data, sandbox=sandbox, limits=limits)
        except (prepare.PrepareError, OSError) as err:
            raise TaskUnavailable(f"benchmark task {task.id} cannot run: its local data could not be made: "
                                  f"{err}") from err
    if problems := unmet_needs(task, dataset_cache, gpus):
        raise TaskUnavailable(f"benchmark task {task.id} cannot run: " + "; and ".join(problems))


def builtin_root() -> Path:
    """The MLGym-layout tree of the built-in suite (inside the installed package)."""
    return Path(__file__).resolve().parent / "tasks"


def builtin_tasks(suite: Literal["builtin", "posttraining"] = "builtin", gpus: int = 0) -> list[BenchmarkTask]:
    """Every task of a built-in suite (`builtin`, or the post-training suite `posttraining`); each YAML is validated
    with the MLGym loader. `gpus`: what each task's runs get (`evaluate.task_gpus`)."""
    root = builtin_root()
    tasks = []
    for task_id, meta in SUITES[suite].items():
        path = root / "configs" / "tasks" / f"{task_id}.yaml"
        if not path.is_file():
            raise BenchmarkError(f"the built-in {suite} suite is incomplete: {path} is missing (reinstall gymforge)")
        config = load_task_config(path)
        if not config.baseline_scores or meta.metric not in config.baseline_scores[0]:
            raise BenchmarkError(f"{path}: baseline_scores must record the metric {meta.metric!r}")
        names = [load_dataset_config(root / "configs" / entry).name for entry in config.dataset_configs]
        tasks.append(BenchmarkTask(
            id=task_id, name=config.name, task_yaml=path, root=root, entrypoint=config.task_entrypoint,
            metric=meta.metric, higher_is_better=meta.higher_is_better, family=meta.family,
            keywords=list(meta.keywords), datasets=[*meta.datasets, *names], benchmark=suite, gpus=gpus,
        ))
    return tasks


def _index_task_ids(configs: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """{task id: config files declaring it} over `configs/*.yaml`, and the files whose id could not be read.

    MLGym runs a task from its config file, and the file name need not be the id (rlMetaMazeMisc lives in
    rlMetaMaze.yaml; imageClassificationCifar10L1.yaml declares imageClassificationCifar10 again).
    """
    found: dict[str, list[Path]] = {}
    unreadable = []
    for path in sorted(configs.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            unreadable.append(f"{path.name} (invalid YAML)")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            unreadable.append(f"{path.name} ({exc})")
            continue
        task_id = data.get("id") if isinstance(data, dict) else None
        if isinstance(task_id, str):
            found.setdefault(task_id, []).append(path)
        else:
            unreadable.append(f"{path.name} (no id field)")
    return found, unreadable


def _pick(task_id: str, paths: list[Path]) -> Path:
    """The config of `task_id`: the only one, or the one named after it (MLGym's own task file)."""
    if len(paths) == 1:
        return paths[0]
    named = [p for p in paths if p.stem == task_id]
    if len(named) == 1:
        return named[0]
    raise BenchmarkError(
        f"task id {task_id} is declared by {len(paths)} configs ({', '.join(p.name for p in paths)}) and none is "
        f"named {task_id}.yaml; rename the one to run"
    )


def mlgym_tasks(mlgym_root: Path | str, task_ids: Sequence[str] | None = None) -> list[BenchmarkTask]:
    """MLGym-Bench's tasks in a checkout, found by the `id` field of `configs/tasks/*.yaml`.

    `task_ids` (default: all 13 of BENCHMARK_TASKS) must all be found: a missing one is an error naming it,
    so AUP is never silently computed over fewer tasks. Dataset identities are the built-in ones plus the
    names (and Hugging Face ids) in the task's dataset configs.
    """
    root = Path(mlgym_root).expanduser().resolve()
    configs = root / "configs" / "tasks"
    if not configs.is_dir():
        what = "does not exist" if not root.exists() else f"has no {configs.relative_to(root)} directory"
        raise BenchmarkError(
            f"evaluate.mlgym_root {root} {what}; point it at a checkout of facebookresearch/MLGym "
            f"(configs/tasks/*.yaml declaring the ids {', '.join(BENCHMARK_TASKS)})"
        )
    wanted = list(BENCHMARK_TASKS) if task_ids is None else list(dict.fromkeys(task_ids))
    if unknown := [t for t in wanted if t not in BENCHMARK_TASKS]:
        raise BenchmarkError(
            f"evaluate.tasks: {', '.join(unknown)} is not an MLGym-Bench task; choose from {', '.join(BENCHMARK_TASKS)}"
        )
    found, unreadable = _index_task_ids(configs)
    if missing := [t for t in wanted if t not in found]:
        hint = ("; set evaluate.tasks to run a subset on purpose" if task_ids is None else "")
        skipped = f" (unreadable: {', '.join(unreadable)})" if unreadable else ""
        raise BenchmarkError(
            f"{configs}: no config declares the MLGym-Bench task id(s) {', '.join(missing)}{skipped}; found "
            f"{len(wanted) - len(missing)} of {len(wanted)}{hint}"
        )
    tasks = []
    for task_id in wanted:
        path = _pick(task_id, found[task_id])
        metric, higher = BENCHMARK_TASKS[task_id]
        config = load_task_config(path)
        family, keywords, known = MLGYM[task_id]
        datasets, hub, local = list(known), [], []
        for entry in config.dataset_configs:
            dataset_path = root / "configs" / entry
            if not dataset_path.is_file():
                raise BenchmarkError(f"{path}: dataset config {entry} does not exist (looked for {dataset_path})")
            dataset = load_dataset_config(dataset_path)
            datasets.append(dataset.name)
            (hub if not dataset.is_local else local).append(dataset.data_path)
            if not dataset.is_local:
                datasets.append(dataset.data_path)
        tasks.append(BenchmarkTask(
            id=task_id, name=config.name, task_yaml=path, root=root, entrypoint=config.task_entrypoint,
            metric=metric, higher_is_better=higher, family=family, keywords=list(keywords),
            datasets=list(dict.fromkeys(datasets)), benchmark="mlgym", hub_datasets=list(dict.fromkeys(hub)),
            local_data=local,
            gpus=MLGYM_GPUS.get(task_id, (0, ""))[0],
        ))
    return tasks


def harbor_tasks(folders: Sequence[Path | str]) -> list[BenchmarkTask]:
    """Harbor task folders as benchmark tasks: the id is the folder's name; the metric and its direction are
    task.toml's `[metadata] metric` and `higher_is_better` (gymforge's exports write them), else Harbor's `reward`,
    higher is better; the GPUs are `[environment] gpus`. Nothing is known of their family or data, so
    decontamination has nothing to compare them on."""
    tasks, seen = [], {}
    for entry in folders:
        folder = Path(entry).expanduser().resolve()
        if not is_harbor_folder(folder) or not (folder / "tests" / "test.sh").is_file():
            raise BenchmarkError(f"evaluate.harbor: {entry} is not a Harbor task folder (task.toml and tests/test.sh)")
        if folder.name in seen:
            raise BenchmarkError(f"evaluate.harbor: {seen[folder.name]} and {entry} are both named {folder.name}, "
                                 "their task id; rename one")
        seen[folder.name] = entry
        harbor = HarborTask.read(folder)
        tasks.append(BenchmarkTask(
            id=folder.name, name=str(harbor.name or folder.name), task_yaml=folder, root=folder, entrypoint="harbor",
            metric=str(harbor.metadata.get("metric") or "reward"),
            higher_is_better=bool(harbor.metadata.get("higher_is_better", True)), family=f"harbor:{folder.name}",
            keywords=[], datasets=[], benchmark="harbor", gpus=harbor.gpus))
    return tasks


def recorded_baseline(task: BenchmarkTask) -> dict[str, float] | None:
    """The baseline scores a task records (the baseline pseudo-model's): an MLGym task's `baseline_scores`, a
    Harbor task's `[metadata] baseline` under its metric (gymforge's exports record it; others have none)."""
    if task.benchmark == "harbor":
        value = HarborTask.read(task.root).metadata.get("baseline")
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return {task.metric: float(value)} if is_number else None
    config = load_task_config(task.task_yaml)
    return dict(config.baseline_scores[0]) if config.baseline_scores else None


def task_digest(task_yaml: Path) -> str:
    """What a task's runs depend on of its files: its YAML's text, or a Harbor folder's contents' digest."""
    return folder_digest(task_yaml) if Path(task_yaml).is_dir() else Path(task_yaml).read_text()


def load_benchmark(evaluate_cfg: EvaluateConfig) -> list[BenchmarkTask]:
    """The tasks `evaluate` runs: the configured benchmark and `evaluate.harbor`'s folders, narrowed to
    `evaluate.tasks` when given."""
    if evaluate_cfg.tasks is not None and not evaluate_cfg.tasks:
        raise BenchmarkError("evaluate.tasks is empty; list task ids or set it to null for every task of the benchmark")
    harbor = harbor_tasks(evaluate_cfg.harbor)
    wanted = evaluate_cfg.tasks
    if harbor and wanted is not None:
        wanted = [t for t in wanted if t not in {h.id for h in harbor}] or None
        harbor = [h for h in harbor if h.id in evaluate_cfg.tasks]
        if wanted is None:  # only Harbor tasks named: the benchmark's own are left out
            return harbor
    if evaluate_cfg.benchmark == "mlgym":
        if not evaluate_cfg.mlgym_root:
            raise BenchmarkError("evaluate.mlgym_root is required when evaluate.benchmark is 'mlgym'")
        tasks = mlgym_tasks(evaluate_cfg.mlgym_root, wanted)
    else:
        tasks = builtin_tasks(evaluate_cfg.benchmark, evaluate_cfg.task_gpus)
    if wanted is not None and evaluate_cfg.benchmark != "mlgym":
        by_id = {t.id: t for t in tasks}
        if unknown := [t for t in wanted if t not in by_id]:
            raise BenchmarkError(
                f"evaluate.tasks: unknown task id(s) {', '.join(unknown)} for the {evaluate_cfg.benchmark} benchmark; "
                f"available: {', '.join([*by_id, *(h.id for h in harbor_tasks(evaluate_cfg.harbor))])}"
            )
        tasks = [by_id[t] for t in dict.fromkeys(wanted)]
    if clash := {t.id for t in tasks} & {h.id for h in harbor}:
        raise BenchmarkError(f"evaluate.harbor: {', '.join(sorted(clash))} is also a task of the "
                             f"{evaluate_cfg.benchmark} benchmark; rename the folder")
    return tasks + harbor


def suite_name(tasks: Sequence[BenchmarkTask]) -> str:
    """The suite the tasks are, as score tables and `scores.json` name it: their `benchmark` (`builtin`,
    `posttraining`, `mlgym`, `harbor`), in order and joined with ` + ` when Harbor folders join a suite
    (`builtin + harbor`). Only Harbor tasks named in `evaluate.tasks` are `harbor`, whatever `evaluate.benchmark` says."""
    return " + ".join(dict.fromkeys(t.benchmark for t in tasks)) or "empty"


def task_meta(tasks: list[BenchmarkTask]) -> dict[str, dict[str, str | bool]]:
    return {t.id: {"metric": t.metric, "higher_is_better": t.higher_is_better} for t in tasks}


def task_meta_file(tasks: list[BenchmarkTask], path: Path | str) -> Path:
    """Write `{id: {metric, higher_is_better}}` as YAML (what `gymforge aup --tasks <file>` reads), atomically."""
    return atomic.write_yaml(path, task_meta(tasks))
