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

MLGYM = Path(__file__).parent / "fixtures" / "mlgym"

pytestmark = pytest.mark.usefixtures("bwrap_backend")  # one-file binds need bubblewrap: skips without it

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
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) == 2  # the baseline's evaluation, the batch
    assert len(singles) == 1 + len(alone) >= 10


def test_a_hanging_or_killed_evaluation_ends_as_in_a_sandbox_of_its_own(tmp_path: Path, monkeypatch) -> None:
    yaml = _task(tmp_path, HANGS_OR_DIES)
    batched, scorers = _outcomes(yaml, tmp_path / "a", monkeypatch, batch=True)
    alone, _ = _outcomes(yaml, tmp_path / "b", monkeypatch, batch=False)
    assert batched == alone
    by_name = {o["name"]: o for o in batched}
    assert "ran past training_timeout" in by_name["header_only"]["rejected"]
    killed = [o for o in batched if "exit status 137" in (o["rejected"] or "")]
    assert {o["name"] for o in batched if o["name"].startswith("repeat_id")} <= {o["name"] for o in killed}
    # the killed ones were scored again alone (a signal may be a limit, which only a sandbox of their own names)
    assert sum("--each" in a for a in scorers) == 1 and len(scorers) == 2 + len(killed)
    assert any(o["score"] is not None for o in batched)  # the others were scored after the hang and the kills
