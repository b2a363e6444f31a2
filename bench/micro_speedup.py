"""Full vs micro verification time of the offline tasks (SandMLE's >13x claim, issue #16).

    python bench/micro_speedup.py                 # every case below, one measurement each
    python bench/micro_speedup.py --repeats 3     # medians of 3 (full and micro alternate)
    python bench/micro_speedup.py --only heavy    # just the data-heavy tasks

Each case is the offline teacher's task for a (topic, bundled dataset) pair, written as the pipeline would
verify it (`gymforge.offline.families.data_heavy.build_task`). The full task goes through verification's
check (`stages.verification.check_baseline`: install, baseline, evaluation in the configured sandbox), then
the micro stage (`stages.micro.micro_task`) builds its variant and checks it the same way. Verification
time = that check's wall time; the teacher episode is left out of both (micro tasks have none). The ratio
is full / micro per task; medians are printed over all tasks and over the data-heavy ones (tens of
thousands of training rows and a baseline whose training dominates: an RBF-kernel SVM tuned by 5-fold CV).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gymforge.core.config import GymforgeConfig, MicroConfig
from gymforge.core.records import VerificationIteration, VerificationReport
from gymforge.offline.families.data_heavy import HEAVY_CASES, build_task
from gymforge.stages.micro import micro_task
from gymforge.stages.verification import check_baseline

# (topic, dataset id or None): one task per offline family, small and large bundled tables.
REGULAR_CASES: tuple[tuple[str, str | None], ...] = (
    ("Penguin species identification from body measurements", "palmerpenguins/penguins"),
    ("Breast cancer diagnosis classification from biopsy features", "sklearn/breast_cancer"),
    ("Handwritten digit recognition from pixel intensities", "sklearn/digits"),
    ("Diabetes disease progression regression from baseline measurements", "sklearn/diabetes"),
    ("Monthly CO2 concentration forecasting", "statsmodels/co2"),
    ("Train and submit a wine cultivar classifier", "sklearn/wine"),
    ("Regression of yearly doctor visits in the RAND health insurance experiment", "statsmodels/randhie"),
    ("Rock-paper-scissors bot exploiting biased opponents", None),
    ("Online bin packing heuristic design", None),
)


def measure(cfg: GymforgeConfig, root: Path, topic: str, dataset: str | None, heavy: bool, repeats: int) -> dict:
    built = build_task(root / "src", topic, dataset, heavy=heavy)
    fulls, micros, micro = [], [], None
    for r in range(repeats):
        it = VerificationIteration(iteration=1, source="generation", task_id=built.task_id)
        checked = check_baseline(cfg, built.tree, root / f"run{r}", built.hidden_columns, it)
        if checked is None:
            raise SystemExit(f"{built.task_id}: the full task fails its check: {it.errors}")
        env, _ = checked
        verified = root / f"env{r}"
        env.write_verified_copy(verified / "verified" / "mlgym", [it.baseline_scores])
        shutil.rmtree(root / f"run{r}", ignore_errors=True)
        full = VerificationReport(item="t0000", status="ok", task_id=built.task_id, entrypoint=built.entrypoint,
                                  iterations=[it], baseline_scores=[it.baseline_scores],
                                  hidden_columns=built.hidden_columns)
        (verified / "report.json").write_text(full.model_dump_json())
        micro = micro_task(cfg, "t0000", verified / "report.json", verified / "verified",
                           root / f"micro{r}" / "report.json", root / f"micro{r}" / "verified")
        if micro.status != "ok":
            raise SystemExit(f"{built.task_id}: the micro task fails its check: {micro.reason}")
        fulls.append(it.timings_s["baseline"])
        micros.append(micro.micro.micro_check_s)
    full_s, micro_s = statistics.median(fulls), statistics.median(micros)
    return {"task": built.task_id + (" (heavy)" if heavy else ""), "entrypoint": built.entrypoint,
            "rows": f"{micro.micro.rows_before}->{micro.micro.rows_after}" if micro.micro.splits else "-",
            "kind": micro.micro.kind, "full_s": full_s, "micro_s": micro_s, "ratio": full_s / micro_s,
            "heavy": heavy, "baseline": full.baseline_scores[0], "micro_baseline": micro.baseline_scores[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-train-rows", type=int, default=MicroConfig().max_train_rows)
    parser.add_argument("--only", choices=("all", "regular", "heavy"), default="all")
    parser.add_argument("--keep", default="", help="build the tasks here and keep them (default: a temporary dir)")
    args = parser.parse_args(argv)
    cases = [(t, d, False) for t, d in REGULAR_CASES] if args.only != "heavy" else []
    cases += [(t, d, True) for t, d in HEAVY_CASES] if args.only != "regular" else []
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="gymforge-micro-bench-"))
    cfg = GymforgeConfig(results_dir=str(scratch / "results"), micro={"max_train_rows": args.max_train_rows})
    rows, started = [], time.monotonic()
    for i, (topic, dataset, heavy) in enumerate(cases):
        row = measure(cfg, scratch / f"case{i}", topic, dataset, heavy, args.repeats)
        rows.append(row)
        print(f"{row['task']:<44} {row['entrypoint']:<22} rows {row['rows']:<13} {row['kind']:<18} "
              f"full {row['full_s']:7.2f} s  micro {row['micro_s']:6.2f} s  x{row['ratio']:.2f}  "
              f"baseline {row['baseline']} -> micro {row['micro_baseline']}", flush=True)
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = [r["ratio"] for r in rows]
    heavy = [r["ratio"] for r in rows if r["heavy"]]
    print(f"\n{len(rows)} tasks in {time.monotonic() - started:.0f} s, micro.max_train_rows={args.max_train_rows}, "
          f"{args.repeats} measurement(s) each")
    if ratios:
        print(f"median full/micro verification time, all offline tasks: x{statistics.median(ratios):.2f}")
    small = [r["ratio"] for r in rows if not r["heavy"]]
    if small:
        print(f"median over the regular offline tasks: x{statistics.median(small):.2f} (their bundled tables have "
              "at most a few thousand rows, so fixed costs (sandbox start, imports, evaluation) dominate)")
    if heavy:
        print(f"median over the data-heavy offline tasks: x{statistics.median(heavy):.2f} (goal: >= 13x)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
