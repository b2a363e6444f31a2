"""Micro-scale variants of verified tasks (SandMLE; docs/rl.md, Micro tasks): the RL environments.

A micro task is its verified task with the training split subsampled to `micro.max_train_rows` rows
(the test split, the files, the metric and the evaluation stay as they are), verified the way the verification stage
verifies a task (`verification.check_baseline`: install, baseline, evaluation) and recorded with its own
baseline scores. Rows are drawn deterministically from the run seed: class labels keep their shares
(at least one row per class), a time series keeps its most recent contiguous rows, anything else is a
uniform sample; kept rows stay in their original order. Tasks without training rows to cut (games,
algorithmic tasks) get a cheaper evaluation where their scorer has a repetition count (matches,
instances, simulations: scaled by `micro.eval_scale`), else they are kept as they are, which the report
says. A micro task that fails its check is discarded with the errors; no teacher repairs it.
"""

from __future__ import annotations

import ast
import math
import re
import shutil
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.records import VerificationIteration, VerificationReport, derive_seed
from gymforge.hub.data import quiet_datasets
from gymforge.runtime import nodelocal
from gymforge.stages.verification import check_baseline, probe_evaluator
from gymforge.tasks.mlgym import dump_yaml, load_dataset_config, load_task_config, workspace_layout

Method = Literal["stratified", "time_tail", "random", "kept_whole", "unsupported"]

TIME_NAME = re.compile(r"(^|_)(date|time|timestamp|datetime|year|month|week|day|hour|period|ds)($|_)", re.I)
# Evaluation settings a scorer repeats to average out noise: counts, never the rules of the game (rounds).
REPEAT_NAME = re.compile(r"^(n_|num_|number_of_)?(matches|games|instances|simulations|episodes|trials|repeats|"
                         r"repetitions|seeds|runs|rollouts)$", re.I)
TABULAR_SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")


class SplitChange(BaseModel):
    """One training split as the micro task has it."""

    path: str  # relative to the MLGym root (a file, or a Hugging Face dataset directory)
    split: str | None = None  # the DatasetDict split, for a Hugging Face dataset
    rows_before: int
    rows_after: int
    method: Method
    label: str | None = None  # the column whose shares were kept (stratified)
    note: str | None = None


class SettingChange(BaseModel):
    """One evaluation setting made cheaper (games, algorithmic tasks)."""

    file: str
    name: str
    before: int
    after: int


class MicroInfo(BaseModel):
    max_train_rows: int
    kind: Literal["subsampled", "cheaper_evaluation", "kept_as_is"]
    note: str = ""
    splits: list[SplitChange] = []
    evaluation: list[SettingChange] = []
    rows_before: int = 0  # training rows over all splits
    rows_after: int = 0
    full_check_s: float | None = None  # install + baseline + evaluation of the full task (its verification)
    micro_check_s: float | None = None  # the same for the micro task
    speedup: float | None = None  # full_check_s / micro_check_s (measured in different jobs: indicative)
    shrink_s: float | None = None


class MicroReport(VerificationReport):
    """The environments report's schema plus what the micro variant changed and what it costs."""

    micro: MicroInfo | None = None


# -- choosing rows ----------------------------------------------------------------------------------------


def _is_discrete(values) -> bool:
    import pandas as pd

    values = values.dropna()
    if values.empty:
        return False
    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        return True
    if pd.api.types.is_float_dtype(values) and not np.all(np.mod(values.to_numpy(float), 1) == 0):
        return False
    return values.nunique() <= 50


def _time_column(frame) -> str | None:
    """A column that orders the rows: datetime-typed, or named like a date and never decreasing."""
    import pandas as pd

    for name in frame.columns:
        col = frame[name]
        if pd.api.types.is_datetime64_any_dtype(col) or (TIME_NAME.search(str(name)) and col.notna().all()):
            try:
                if len(col) > 1 and col.is_monotonic_increasing:
                    return str(name)
            except TypeError:
                continue
    return None


def choose_rows(frame, n: int, rng: np.random.Generator, labels: list[str], stratify: bool = True
                ) -> tuple[np.ndarray, Method, str | None]:
    """Sorted positions of the `n` rows to keep, how they were chosen, and the stratification label."""
    total = len(frame)
    if total <= n:
        return np.arange(total), "kept_whole", None
    if _time_column(frame) is not None:
        return np.arange(total - n, total), "time_tail", None
    label = next((c for c in labels if c in frame.columns and _is_discrete(frame[c])), None) if stratify else None
    if label is not None:
        keys = frame[label].astype(str).where(frame[label].notna(), "<missing>").to_numpy()
        classes, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        if len(classes) <= n:
            # Largest remainders over proportional quotas, every class at least once.
            exact = counts * n / total
            quota = np.minimum(np.maximum(np.floor(exact).astype(int), 1), counts)
            order = np.argsort(-(exact - np.floor(exact)), kind="stable")
            i = 0
            while quota.sum() < n:
                c = order[i % len(classes)]
                if quota[c] < counts[c]:
                    quota[c] += 1
                i += 1
            while quota.sum() > n:  # the minimum of one per class overshot: take from the largest
                c = int(np.argmax(np.where(quota > 1, quota, -1)))
                quota[c] -= 1
            picked = [rng.choice(np.flatnonzero(inverse == c), size=int(q), replace=False)
                      for c, q in enumerate(quota)]
            return np.sort(np.concatenate(picked)), "stratified", label
    return np.sort(rng.choice(total, size=n, replace=False)), "random", None


# -- rewriting a task tree --------------------------------------------------------------------------------


def _label_columns(hidden: dict[str, list[str]] | None, train_columns, test_columns) -> list[str]:
    """The target: what verification withheld from the agent, else what the train split has and test lacks."""
    named = [c for cols in (hidden or {}).values() for c in cols]
    if named:
        return named
    if test_columns is not None:
        return [c for c in train_columns if c not in set(test_columns)]
    return []


def _is_train_name(name: str) -> bool:
    lowered = name.lower()
    return "train" in lowered and not any(w in lowered for w in ("test", "valid", "val_", "dev"))


def _shrink_hf(path: Path, rel: str, dataset, cfg: GymforgeConfig, slot: str,
               hidden: dict[str, list[str]] | None) -> list[SplitChange]:
    import datasets

    with quiet_datasets():
        dd = datasets.load_from_disk(str(path))
    if not isinstance(dd, datasets.DatasetDict):
        return [SplitChange(path=rel, rows_before=len(dd), rows_after=len(dd), method="unsupported",
                            note="a single Dataset, not a DatasetDict with a train split")]
    wanted = dataset.train_split.name if dataset.train_split else "train"
    split = wanted if wanted in dd else next((s for s in dd if _is_train_name(s)), None)
    if split is None:
        return [SplitChange(path=rel, rows_before=0, rows_after=0, method="unsupported",
                            note=f"no train split among {sorted(dd)}")]
    frame = dd[split].to_pandas()
    test = next((s for s in dd if s != split and "test" in s.lower()), None)
    labels = _label_columns(hidden, frame.columns, dd[test].column_names if test else None)
    rng = np.random.default_rng(derive_seed(cfg.seed, "micro", slot, rel, split))
    keep, method, label = choose_rows(frame, cfg.micro.max_train_rows, rng, labels, cfg.micro.stratify)
    change = SplitChange(path=rel, split=split, rows_before=len(frame), rows_after=len(keep), method=method, label=label)
    if method != "kept_whole":
        dd[split] = dd[split].select(keep.tolist())
        with quiet_datasets(), atomic.directory(path) as tmp:
            dd.save_to_disk(str(tmp))
    return [change]


def _read_table(path: Path):
    import pandas as pd

    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


def _write_table(frame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.micro")
    if path.suffix == ".parquet":
        frame.to_parquet(tmp, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(tmp, orient="records", lines=True)
    else:
        frame.to_csv(tmp, index=False, sep="\t" if path.suffix == ".tsv" else ",")
    tmp.replace(path)


def _shrink_files(root: Path, path: Path, dataset, cfg: GymforgeConfig, slot: str,
                  hidden: dict[str, list[str]] | None) -> list[SplitChange]:
    """Tables in a data directory (or a data file) whose name marks them as training data."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    regex = re.compile(dataset.train_split.file_regex) if dataset.train_split else None
    train = [p for p in files if p.suffix in TABULAR_SUFFIXES
             and (regex.search(p.name) if regex else _is_train_name(p.name))]
    changes = []
    for file in train:
        rel = file.relative_to(root).as_posix()
        frame = _read_table(file)
        tests = [p for p in files if p.suffix == file.suffix and "test" in p.name.lower()]
        test_columns = list(_read_table(tests[0]).columns) if tests else None
        labels = _label_columns(hidden, frame.columns, test_columns)
        rng = np.random.default_rng(derive_seed(cfg.seed, "micro", slot, rel))
        keep, method, label = choose_rows(frame, cfg.micro.max_train_rows, rng, labels, cfg.micro.stratify)
        if method != "kept_whole":
            _write_table(frame.iloc[keep], file)
        changes.append(SplitChange(path=rel, rows_before=len(frame), rows_after=len(keep), method=method, label=label))
    return changes


def _note(change: SplitChange) -> str:
    how = {"stratified": f"keeping the shares of `{change.label}`", "time_tail": "its most recent rows, in order",
           "random": "a uniform sample"}.get(change.method, "")
    where = f"split `{change.split}`" if change.split else f"`{Path(change.path).name}`"
    return (f"Micro-scale variant: the training data ({where}) keeps {change.rows_after} of its "
            f"{change.rows_before} rows ({how}); the test data and the scoring are unchanged.")


def scale_repeats(source: str, scale: float) -> tuple[str, list[tuple[str, int, int]]]:
    """The evaluation script with its repetition counts (module-level `MATCHES = 5`, keyword arguments
    like `num_simulations=10000`) scaled by `scale`, at least 1; returns (source, [(name, before, after)])."""
    tree = ast.parse(source)
    hits: list[tuple[ast.Constant, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            hits.append((node.value, node.targets[0].id))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            hits += [(kw.value, kw.arg) for kw in node.keywords if kw.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # def simulate(..., num_simulations=1000)
            args = node.args.posonlyargs + node.args.args
            defaulted = args[len(args) - len(node.args.defaults):]  # the last positional args carry the defaults
            hits += list(zip(node.args.defaults, (a.arg for a in defaulted), strict=True))
            hits += [(d, a.arg) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                     if d is not None]
    lines = source.splitlines(keepends=True)
    offsets = np.cumsum([0] + [len(line.encode()) for line in lines]).tolist()
    edits, changes = [], []
    for value, name in hits:
        if not (REPEAT_NAME.match(name) and isinstance(value, ast.Constant) and type(value.value) is int
                and value.value > 1):
            continue
        after = max(1, math.ceil(value.value * scale))
        if after == value.value:
            continue
        start = offsets[value.lineno - 1] + value.col_offset
        end = offsets[value.end_lineno - 1] + value.end_col_offset
        edits.append((start, end, str(after)))
        changes.append((name, value.value, after))
    data = source.encode()
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text.encode() + data[end:]
    return data.decode(), changes


def shrink_task(cfg: GymforgeConfig, slot: str, tree: Path, hidden: dict[str, list[str]] | None) -> MicroInfo:
    """Rewrite the MLGym tree `tree` (a copy) into its micro variant, in place."""
    task_yaml = next((tree / "configs" / "tasks").glob("*.yaml"))
    task = load_task_config(task_yaml)
    info = MicroInfo(max_train_rows=cfg.micro.max_train_rows, kind="kept_as_is")
    datasets = []
    for entry in task.dataset_configs:
        dataset_yaml = tree / "configs" / entry
        dataset = load_dataset_config(dataset_yaml)
        datasets.append(dataset)
        if not dataset.is_local:
            info.note += f"{dataset.name}: loaded from the hub by id ({dataset.data_path}), not subsampled. "
            continue
        path = tree / dataset.data_path
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            changes = _shrink_hf(path, dataset.data_path, dataset, cfg, slot, hidden)
        elif path.exists():
            changes = _shrink_files(tree, path, dataset, cfg, slot, hidden)
        else:
            changes = []
        info.splits += changes
        cut = [c for c in changes if c.rows_after < c.rows_before]
        if cut:
            text = dataset.description.rstrip() + "\n\n" + " ".join(_note(c) for c in cut)
            atomic.write_text(dataset_yaml, dump_yaml(dataset.model_copy(update={"description": text})))
    info.rows_before = sum(c.rows_before for c in info.splits)
    info.rows_after = sum(c.rows_after for c in info.splits)
    if info.rows_after < info.rows_before:
        info.kind = "subsampled"
    elif not info.splits and task.task_entrypoint == "PythonSubmissionTasks" and task.evaluation_paths:
        layout = workspace_layout(task, datasets)
        rel = layout.get(task.evaluation_paths[0], task.evaluation_paths[0])
        script = tree / rel
        if script.is_file():
            try:
                text, changes = scale_repeats(script.read_text(), cfg.micro.eval_scale)
            except SyntaxError:
                changes = []
            if changes:
                atomic.write_text(script, text)
                info.evaluation = [SettingChange(file=rel, name=n, before=b, after=a) for n, b, a in changes]
                info.kind = "cheaper_evaluation"
    if info.kind == "kept_as_is":
        if info.splits:
            why = f"its training data has at most {cfg.micro.max_train_rows} rows already"
        elif task.task_entrypoint == "PythonSubmissionTasks":
            why = "no training data, and its evaluation has no repetition count to lower"
        else:
            why = "no local training data this stage can subsample"
        info.note += f"Kept as it is: {why}."
    info.note = info.note.strip()
    return info


# -- the stage ----------------------------------------------------------------------------------------------


def micro_task(cfg: GymforgeConfig, slot: str, report: Path, env: Path, report_out: Path,
               env_out: Path) -> MicroReport:
    """Build and verify the micro variant of the verified task of `slot` (rule `micro_task`)."""
    full = VerificationReport.model_validate_json(Path(report).read_text())
    with atomic.directory(env_out) as out:
        if full.status != "ok":
            result = MicroReport(item=slot, status="skipped", reason_code=full.reason_code or "not_verified",
                                 reason=f"the full task was not verified ({full.status})"
                                 + (f": {full.reason}" if full.reason else ""))
        else:
            # the shrunk task's check runs in node-local scratch ($TMPDIR when set); only the micro tree and the report
            # land in results/, each moved into place atomically
            with nodelocal.scratch(Path(env_out), f".{slot}-micro") as scratch:
                result = _micro(cfg, slot, full, Path(env), out, scratch)
    atomic.write_text(report_out, result.model_dump_json(indent=2))
    return result


def _micro(cfg: GymforgeConfig, slot: str, full: VerificationReport, env_in: Path, out: Path,
           scratch: Path) -> MicroReport:
    report = MicroReport(item=slot, status="ok", task_id=full.task_id, entrypoint=full.entrypoint,
                         needs_gpu=full.needs_gpu,
                         hidden_columns=full.hidden_columns, metric=full.metric,
                         higher_is_better=full.higher_is_better)  # what ranks its scores (the RL stage reads it)
    tree = scratch / "mlgym"
    shutil.copytree(env_in / "mlgym", tree)
    started = time.monotonic()
    info = shrink_task(cfg, slot, tree, full.hidden_columns)
    info.shrink_s = round(time.monotonic() - started, 3)
    it = VerificationIteration(iteration=1, source="generation", task_id=full.task_id)
    report.iterations.append(it)
    checked = check_baseline(cfg, tree, scratch / "run", full.hidden_columns, it)
    info.micro_check_s = it.timings_s.get("baseline")
    full_timings = full.iterations[-1].timings_s if full.iterations else {}
    info.full_check_s = full_timings.get("baseline")
    if info.full_check_s and info.micro_check_s:
        info.speedup = round(info.full_check_s / info.micro_check_s, 2)
    report.micro = info
    if checked is None:
        report.status, report.reason_code = "discarded", "micro_verification_failed"
        report.reason = "the micro variant fails its check: " + "; ".join(it.errors)[:2000]
        return report
    env, baseline = checked
    # Cutting the data can break an evaluator (a class absent, a degenerate split): probe it again.
    if cfg.verification.probes and full.metric is not None and not probe_evaluator(
            env, baseline.metrics, full.metric, bool(full.higher_is_better), derive_seed(cfg.seed, "micro", slot), it):
        report.status = "discarded"
        report.reason_code = "gameable_evaluator" if it.gameable else "micro_verification_failed"
        report.reason = "the micro variant fails its evaluator probes: " + "; ".join(it.errors)[:2000]
        return report
    env.write_verified_copy(out / "mlgym", [it.baseline_scores])
    report.baseline_scores = [it.baseline_scores]
    return report
