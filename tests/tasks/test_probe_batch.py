"""A CSV task's evaluator probes are scored in one sandbox (`Scoring.evaluate_each`, evalkit/score.py --each):
each probe's outcome must be the one a sandbox of its own gives, even for an evaluator that leaves state behind
(files in /tmp and /dev/shm, a daemon, a rewritten submission), hangs, or is killed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gymforge.sandbox import local
from gymforge.tasks.scoring import Scoring
from gymforge.tools.check_task import check_task

MLGYM = Path(__file__).parents[1] / "fixtures" / "mlgym"

# One-file binds need bubblewrap: skips without it. `waits`: its evaluators hang to their timeout, every probe scored
# twice (batched, then alone), ~1 min on one worker that mostly waits: dealt first, it overlaps the rest.
pytestmark = [pytest.mark.usefixtures("bwrap_backend"), pytest.mark.waits]

# csvTiny's evaluator (RMSE, lower is better), made to misbehave. Run alone, each run sees a fresh sandbox and scores
# honestly; a run that sees what an earlier one left (a file, a live daemon) or that could rewrite its submission
# prints a perfect score, which the probes would report as gameable.
LEAKY = '''
import os, subprocess, sys, time
def leaked():
    return os.path.exists("/tmp/seen") or os.path.exists("/dev/shm/seen") or (
        os.path.exists("/dev/shm/alive") and time.time() - os.path.getmtime("/dev/shm/alive") < 1)
def rewrote(path):
    try:
        with open(path, "a") as f:
            f.write("")
        return True
    except OSError:
        return False
if leaked() or rewrote(sys.argv[sys.argv.index("--submission_file") + 1]):
    print('{"rmse": 0.0}')
    sys.exit(0)
open("/tmp/seen", "w").close()
open("/dev/shm/seen", "w").close()
subprocess.Popen([sys.executable, "-c", "import os, time\\nfor _ in range(600):\\n    os.utime('/dev/shm/alive') "
                  "if os.path.exists('/dev/shm/alive') else open('/dev/shm/alive', 'w').close()\\n    time.sleep(0.05)"],
                 start_new_session=True)
time.sleep(0.2)
'''

# Hangs on a submission of the header alone, and kills itself on one that repeats the first id on every row.
HANGS_OR_DIES = '''
import os, signal, sys, time
rows = open(sys.argv[sys.argv.index("--submission_file") + 1]).read().splitlines()
if len(rows) == 1:
    time.sleep(600)
if len(rows) > 2 and len({r.split(",")[0] for r in rows[1:]}) == 1:
    os.kill(os.getpid(), signal.SIGKILL)
'''


def _task(tmp_path: Path, prelude: str) -> Path:
    """csvTiny with `prelude` run before its evaluator, and a 5 s training_timeout."""
    root = tmp_path / "mlgym"
    shutil.copytree(MLGYM, root)
    evaluator = root / "data" / "csvTiny" / "evaluate.py"
    evaluator.write_text(prelude + "\n" + evaluator.read_text())
    yaml = root / "configs" / "tasks" / "csvTiny.yaml"
    yaml.write_text(yaml.read_text().replace("training_timeout: 120", "training_timeout: 5"))
    return yaml


def _outcomes(task_yaml: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *, batch: bool):
    """The probes' outcomes (timing aside) and how many sandboxes the scoring of them ran."""
    runs = []
    real = local.LocalBackend.run_once

    def counted(self, workspace, argv, **kwargs):
        runs.append(argv)
        return real(self, workspace, argv, **kwargs)

    monkeypatch.setattr(local.LocalBackend, "run_once", counted)
    if not batch:
        monkeypatch.setattr(Scoring, "batches", lambda self: False)
    report = check_task(task_yaml, None, out, sandbox="local", gpus=0)
    monkeypatch.undo()
    scorers = [a for a in runs if any(str(x).endswith("/score.py") for x in a)]
    return [o.model_dump(exclude={"seconds"}) for o in report.probes], scorers


def test_state_an_evaluator_leaves_never_reaches_the_next_probe(tmp_path: Path, monkeypatch) -> None:
    yaml = _task(tmp_path, LEAKY)
    batched, scorers = _outcomes(yaml, tmp_path / "a", monkeypatch, batch=True)
    alone, singles = _outcomes(yaml, tmp_path / "b", monkeypatch, batch=False)
    assert batched == alone
    assert not any(o["gameable"] for o in batched), [o for o in batched if o["gameable"]]
    # the batch stands for the probes' scorers; the others (the baseline's, the coherence check's) are as before
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) - 1 == len(singles) - len(alone)
    assert len(alone) >= 10


def test_a_hanging_or_killed_evaluation_ends_as_in_a_sandbox_of_its_own(tmp_path: Path, monkeypatch) -> None:
    yaml = _task(tmp_path, HANGS_OR_DIES)
    batched, scorers = _outcomes(yaml, tmp_path / "a", monkeypatch, batch=True)
    alone, singles = _outcomes(yaml, tmp_path / "b", monkeypatch, batch=False)
    assert batched == alone
    by_name = {o["name"]: o for o in batched}
    assert "ran past training_timeout" in by_name["header_only"]["rejected"]
    killed = [o for o in batched if "exit status 137" in (o["rejected"] or "")]
    assert {o["name"] for o in batched if o["name"].startswith("repeat_id")} <= {o["name"] for o in killed}
    # the killed ones were scored again alone (a signal may be a limit, which only a sandbox of their own names)
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) - 1 - len(killed) == len(singles) - len(alone)
    assert any(o["score"] is not None for o in batched)  # the others were scored after the hang and the kills


# ---- Python and model tasks: one scorer sandbox, a submission sandbox per probe --------------------------------

BUILTIN = Path(__file__).resolve().parents[2] / "src" / "gymforge" / "benchmark" / "tasks"

# Prepended to graphColoring's baseline module, which every Python probe loads in its submission sandbox. Alone, each
# probe's sandbox is fresh; a sandbox that saw an earlier probe (its /tmp, /dev/shm, a live daemon, another channel)
# fails the import, and the outcomes would differ.
LEAKY_SUBMISSION = '''
import os as _o, subprocess as _s, sys as _y, time as _t
if (_o.path.exists("/tmp/seen") or _o.path.exists("/dev/shm/seen") or (
        _o.path.isdir("/gymforge-channel") and len(_o.listdir("/gymforge-channel")) > 2) or (
        _o.path.exists("/dev/shm/alive") and _t.time() - _o.path.getmtime("/dev/shm/alive") < 1)):
    raise RuntimeError("state of an earlier probe")
open("/tmp/seen", "w").close()
open("/dev/shm/seen", "w").close()
_s.Popen([_y.executable, "-c", "import os, time\\nfor _ in range(600):\\n    os.utime('/dev/shm/alive') "
          "if os.path.exists('/dev/shm/alive') else open('/dev/shm/alive', 'w').close()\\n    time.sleep(0.05)"],
         start_new_session=True)
'''


def _python_task(tmp_path: Path, task: str, module: str) -> Path:
    root = tmp_path / "builtin"
    shutil.copytree(BUILTIN / "configs", root / "configs")
    shutil.copytree(BUILTIN / "data" / task, root / "data" / task)
    path = root / "data" / task / module
    path.write_text(LEAKY_SUBMISSION + path.read_text())
    return root / "configs" / "tasks" / f"{task}.yaml"


@pytest.mark.parametrize(("task", "module"), [("graphColoring", "coloring.py"), ("gridNavigation", "policy.py")])
def test_python_probes_share_a_scorer_and_each_gets_a_fresh_submission_sandbox(tmp_path: Path, monkeypatch, task: str,
                                                                                module: str) -> None:
    yaml = _python_task(tmp_path, task, module)
    batched, scorers = _outcomes(yaml, tmp_path / "a", monkeypatch, batch=True)
    alone, singles = _outcomes(yaml, tmp_path / "b", monkeypatch, batch=False)
    assert batched == alone  # alone, no probe's sandbox can see an earlier one's state
    assert len(batched) == 9
    if task == "graphColoring":  # every probe's module loaded (its markers written, no earlier one's seen) and scored
        assert all(o["score"] is not None for o in batched)
    else:  # its policy's numbers have no degenerate form: the wrappers' not-applicable exit is read in the batch too
        assert sum(not o["applicable"] for o in batched) == 6
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) - 1 == len(singles) - len(alone)


# modelTiny made a pickled-model task whose evaluator loads the model through gymforge_eval (so it batches): the
# baseline pickles a polynomial, the config names the pickle, the model's predictions are scored on a grid.
POLY = '''
class Poly:
    def __init__(self, coefficients):
        self.coefficients = coefficients

    def predict(self, xs):
        return [sum(c * x**k for k, c in enumerate(self.coefficients)) for x in xs]
'''
MODEL_BASELINE = '''
import pickle
import yaml
from poly import Poly
with open("model.pkl", "wb") as f:
    pickle.dump(Poly([1.5, -0.5, 0.4]), f)
with open("model.yaml", "w") as f:
    yaml.safe_dump({"model_path": "model.pkl"}, f)
'''
MODEL_EVALUATE = '''
import argparse, json, math, yaml
try:
    from gymforge_eval import load_pickle
except ImportError:
    import pickle
    def load_pickle(path):
        with open(path, "rb") as f:
            return pickle.load(f)
parser = argparse.ArgumentParser()
parser.add_argument("--config_fname", required=True)
with open(parser.parse_args().config_fname) as f:
    model = load_pickle(yaml.safe_load(f)["model_path"])
grid = [-2 + 0.1 * i for i in range(41)]
predicted = [float(p) for p in model.predict(grid)]
if len(predicted) != len(grid) or not all(math.isfinite(p) for p in predicted):
    raise SystemExit("one finite prediction per point")
print(json.dumps({"mse": sum((p - (0.5 * x * x - x + 2)) ** 2 for p, x in zip(predicted, grid)) / len(grid)}))
'''


def test_model_probes_share_a_scorer_and_each_gets_a_fresh_submission_sandbox(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "mlgym"
    shutil.copytree(MLGYM, root)
    data = root / "data" / "modelTiny"
    (data / "poly.py").write_text(LEAKY_SUBMISSION + POLY)
    (data / "baseline.py").write_text(MODEL_BASELINE)
    (data / "evaluate.py").write_text(MODEL_EVALUATE)
    yaml = root / "configs" / "tasks" / "modelTiny.yaml"
    yaml.write_text(yaml.read_text().replace("- data/modelTiny/samples.csv", "- data/modelTiny/samples.csv\n"
                                             "- data/modelTiny/poly.py"))
    batched, scorers = _outcomes(yaml, tmp_path / "a", monkeypatch, batch=True)
    alone, singles = _outcomes(yaml, tmp_path / "b", monkeypatch, batch=False)
    assert batched == alone
    by_name = {o["name"]: o for o in batched}
    assert len(batched) == 8 and by_name["zeros"]["score"] is not None and by_name["mean"]["score"] is not None
    assert "failed" in by_name["short"]["rejected"]  # one prediction too few
    assert not any(o["gameable"] for o in batched)
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) - 1 == len(singles) - len(alone)


# ---- score.py --each without a sandbox: a child runs the script as a fresh interpreter would ---------------------

# What a script can tell about how it was started; the random draws tell whether the generators were seeded afresh.
INTROSPECT = '''
import argparse, json, random, sys
try:
    import numpy
except ImportError:
    numpy = None
main = sys.modules["__main__"]
print(json.dumps({"name": __name__, "file": __file__, "package": __package__, "spec": __spec__, "loader": __loader__,
                  "doc": __doc__, "main_is_this_module": vars(main) is globals(), "argv": sys.argv,
                  "path_has_workspace": any(p.startswith("/workspace") or p == "" for p in sys.path),
                  "random": random.random(), "numpy": None if numpy is None else float(numpy.random.random())}))
'''


def test_an_each_child_runs_the_script_as_it_runs_alone(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from gymforge.tasks.scoring import EVALKIT

    script = tmp_path / "evaluate.py"
    script.write_text(INTROSPECT)
    probes = tmp_path / "probes"
    probes.mkdir()
    for i in range(3):
        (probes / str(i)).write_bytes(b"")

    def score(*flags: str) -> Path:
        out = tmp_path / f"out{len(flags)}"
        out.mkdir()
        subprocess.run([sys.executable, "-I", str(EVALKIT / "score.py"), str(out), *flags, str(script), "--x", "1"],
                       check=True, cwd=tmp_path, timeout=120)
        return out

    alone = json.loads((score() / "stdout").read_text())
    each = score("--each", str(probes), "-", "60")
    children = [json.loads((each / str(i) / "stdout").read_text()) for i in range(3)]
    drawn = ("random", "numpy")
    for child in children:
        assert {k: v for k, v in child.items() if k not in drawn} == {k: v for k, v in alone.items() if k not in drawn}
    assert alone["name"] == "__main__" and alone["main_is_this_module"] and alone["argv"] == [str(script), "--x", "1"]
    for key in drawn:  # each child draws from its own freshly seeded generator, as a process of its own would
        assert len({c[key] for c in children}) == 3
