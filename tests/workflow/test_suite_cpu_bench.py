"""bench/suite_cpu.py's labels: accounting names every Python process `python3`, so the per-kind table of where the
CPU went (docs/layout.md, "Where the time goes") labels each process by the command line it was seen with."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # suite_cpu imports quickstart, as it does when run from bench/
_spec = importlib.util.spec_from_file_location("suite_cpu", BENCH / "suite_cpu.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["suite_cpu"] = bench  # its dataclass looks its module up
_spec.loader.exec_module(bench)

VENV_PY = "/work/x/.venv/bin/python3"


@pytest.mark.parametrize(("argv", "label"), [
    # a Snakemake job: the log option, then with-gpus wrapping the stage's verb
    ([VENV_PY, "-m", "gymforge", "--log", "results/logs/t0.log", "with-gpus", "0", "--", VENV_PY, "-m", "gymforge",
      "verify-environment", "--config", "c.json"], "gymforge verify-environment"),
    ([VENV_PY, "-m", "gymforge", "--log", "l.log", "proposal", "--slot", "t0002"], "gymforge proposal"),
    (["/work/x/.venv/bin/gymforge", "status"], "gymforge status"),
    # task code in a sandbox, the scorer launcher with its interpreter flag, Snakemake's entry script
    (["python", "baseline.py"], "baseline.py"),
    (["/opt/venv/bin/python", "-I", "/opt/evalkit/score.py", "/tmp/out", "evaluate.py"], "score.py"),
    (["/usr/bin/python3", "/work/x/.venv/bin/snakemake", "--cores", "2"], "snakemake"),
    (["python", "-c", "print(1)"], "python -c"),
    ([VENV_PY, "-m", "gymforge.llm.serving", "--checkpoint", "c"], "python -m gymforge.llm.serving"),
    (["bwrap", "--die-with-parent"], "bwrap-comm"),
    ([], "bwrap-comm"),
])
def test_a_process_is_labelled_by_what_it_ran(argv: list[str], label: str) -> None:
    assert bench.command_label(argv, "bwrap-comm") == label


def test_a_reused_pid_gets_each_of_its_commands_in_turn() -> None:
    lines = bench.CommandLines()
    lines.argv[7] = [["python", "first.py"], ["python", "second.py"]]
    records = [bench.Process("python3", 1.0, 7, 1), bench.Process("python3", 2.0, 7, 1),
               bench.Process("sh", 0.0, 8, 1)]
    assert lines.labels(records) == ["first.py", "second.py", "sh"]


def test_the_sampler_sees_a_process_that_lives_past_its_interval(tmp_path: Path) -> None:
    script = tmp_path / "distinctive_name.py"
    script.write_text("import time; time.sleep(0.5)\n")
    lines = bench.CommandLines(interval=0.02)
    lines.start()
    try:
        proc = subprocess.Popen([sys.executable, str(script)])
        proc.wait()
        time.sleep(0.05)
    finally:
        lines.stop()
    assert bench.command_label(lines.argv[proc.pid][-1], "python3") == "distinctive_name.py"
