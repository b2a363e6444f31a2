"""Offline tasks straight from the bundled datasets, and data-heavy variants of them (micro-task benchmark).

`build_task` writes the MLGym tree the pipeline would verify for a (topic, dataset) pair: the offline
teacher's clean draft (configs and starter code, as a repair attempt writes them) and the hub's
deterministic train/test split, without running topics, proposals or the repair loop. With `heavy`, the
baseline's model is swapped for one whose training time grows with the training rows as real ML
pipelines' does (an RBF-kernel support vector machine, its C tuned by 5-fold cross-validation: quadratic
or worse in the rows), so on the largest bundled table (statsmodels' RAND health insurance experiment, 20,190
rows) the baseline's training dominates the verification: the case micro tasks exist for. Nothing is
invented: the rows are the package's rows, only the model differs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymforge.core.records import GenerationRecord, ProposalRecord
from gymforge.hub.data import feature_dtypes, quiet_datasets, split_train_test
from gymforge.llm.codeblocks import parse_files
from gymforge.offline import catalog, families
from gymforge.tasks.files import answer_columns, validate_config_files, write_task_tree

HEAVY_MODELS = {
    "classification": ("from sklearn.model_selection import GridSearchCV\nfrom sklearn.svm import SVC",
                       'GridSearchCV(SVC(gamma="scale"), {"C": [0.3, 1.0, 3.0]})'),
    "regression": ("from sklearn.model_selection import GridSearchCV\nfrom sklearn.svm import SVR",
                   'GridSearchCV(SVR(gamma="scale"), {"C": [0.3, 1.0, 3.0]})'),
}

# (topic, dataset id): the data-heavy offline tasks of the micro benchmark, on the largest bundled table.
HEAVY_CASES: tuple[tuple[str, str], ...] = (
    ("Regression of yearly doctor visits in the RAND health insurance experiment", "statsmodels/randhie"),
    ("Classification of the individual deductible plan (idp) in the RAND health insurance experiment",
     "statsmodels/randhie"),
)


@dataclass
class BuiltTask:
    tree: Path
    task_id: str
    entrypoint: str
    hidden_columns: dict[str, list[str]] | None
    train_rows: int
    heavy: bool


def dataset_details(dataset_id: str) -> tuple[dict[str, Any], Any]:
    """The dataset as the offline hub describes it, and the train/test split the hub materialises."""
    import datasets

    entry = catalog.BY_ID[dataset_id]
    frame = catalog.load_frame(entry)
    ds = datasets.Dataset.from_pandas(frame, preserve_index=False)
    split = split_train_test(ds, chronological=entry.task == "time-series",
                             stratify_by=entry.target if entry.task == "classification" else None)
    card = {"task_categories": catalog.TASK_CATEGORIES[entry.task], "target": entry.target}
    if entry.time_column:
        card["time_column"] = entry.time_column
    details = {"id": dataset_id, "description": entry.description, "tags": list(entry.tags), "card_data": card,
               "features": feature_dtypes(ds.features), "splits": {"train": len(ds)},
               "example_rows": json.loads(frame.head(3).to_json(orient="records", date_format="iso")),
               "is_local": True}
    return details, split


def make_heavy(baseline: str, problem: str) -> str:
    """The baseline with its model replaced by the data-heavy one (same features, same submission)."""
    model_import, model = HEAVY_MODELS["classification" if problem == "classification" else "regression"]
    source, n = re.subn(r"return make_pipeline\(features, .*\)\n", f"return make_pipeline(features, {model})\n",
                        baseline)
    if n != 1:
        raise ValueError("the baseline has no `make_pipeline(features, <model>)` to swap")
    source = re.sub(r"^from sklearn\.(ensemble|linear_model|neighbors|tree) import \w+\n", model_import + "\n",
                    source, count=1, flags=re.M)
    return re.sub(r"^\"\"\"Baseline for (\S+): .*?$", r'"""Baseline for \1: an RBF-kernel SVM, C tuned by 5-fold CV.',
                  source, count=1, flags=re.M)


def build_task(root: Path, topic: str, dataset_id: str | None, *, seed: int = 0, heavy: bool = False,
               metric: str = "") -> BuiltTask:
    """Write the MLGym tree of the offline teacher's task for (topic, dataset) under `root`."""
    details, split = dataset_details(dataset_id) if dataset_id else (None, None)
    proposal = {"topic": topic, "metric": metric, "description": f"A task about {topic.lower()}.", "dataset": details}
    # attempt 1 is a repair: the offline teacher writes it without a planted bug.
    configs = parse_files(families.write_configs(proposal, seed=seed, attempt=1))
    code = parse_files(families.write_code(configs, details, seed=seed + 1, attempt=1))
    bundle = validate_config_files(configs)
    task_id = bundle.task.id
    if heavy:
        spec = families.spec_from_configs(configs, details)
        path = next(p for p in code if p.endswith("/baseline.py"))
        code[path] = make_heavy(code[path], spec.problem)
    root = Path(root)
    write_task_tree(root, bundle, code)
    if split is not None:
        with quiet_datasets():
            split.save_to_disk(str(root / "data" / task_id / "data"))
    hidden = None
    if details is not None:
        hidden = answer_columns(ProposalRecord(item="bench", status="ok", dataset=details),
                                GenerationRecord(item="bench", status="ok", files=code))
    return BuiltTask(tree=root, task_id=task_id, entrypoint=bundle.task.task_entrypoint, hidden_columns=hidden,
                     train_rows=len(split["train"]) if split is not None else 0, heavy=heavy)
