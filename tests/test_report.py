"""End to end (`all`, through `scores`) on a tiny offline config, then `snakemake --report`: every section is there."""

import json
import shutil
import subprocess

import pytest

from gymforge.report.summary import summary_html
from gymforge.tools.status import collect
from finished_run import snakemake

SECTIONS = ["Funnel", "Trajectories", "Training", "Scores"]
FILES = ["summary.html", "funnel.png", "kept_per_task.png", "trajectory_stats.png", "loss.png", "violins.png",
         "aup.png", "profiles.png"]


@pytest.fixture(scope="module")
def finished(finished_run):
    """The session's finished tiny run (tests/finished_run.py: `all`, every output the report shows), reported."""
    proc = snakemake(finished_run, "--report", "report.html")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return finished_run


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_scores_stage_and_status(finished):
    stages = collect(finished / "results")["stages"]
    assert stages["checkpoints"]["ok"] == 1
    assert stages["scores"]["planned"] == 3 * 2 and stages["scores"]["done"] == 6
    rows = (finished / "results" / "scores" / "aup.csv").read_text().splitlines()
    assert rows[0] == "Model,Best AUP,Last AUP"
    assert {r.split(",")[0] for r in rows[1:]} == {"teacher", "student-base", "student-sft", "baseline"}
    replies = json.loads((finished / "results" / "scores" / "replies.json").read_text())
    assert set(replies) == {"teacher", "student-base", "student-sft"}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_report_holds_every_section(finished):
    page = (finished / "report.html").read_text()
    for name in SECTIONS + FILES:
        assert name in page, name


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_report_renders_in_a_headless_browser(finished):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium here (Debian: apt-get install chromium)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", f"file://{finished / 'report.html'}"], capture_output=True, text=True,
                         timeout=120).stdout
    for section in SECTIONS:
        assert section in dom, section


def test_summary_page_lists_every_stage_and_reason(tmp_path):
    report = {"stages": {
        "topics": {"planned": 4, "done": 4, "ok": 3, "skipped": 0, "discarded": {"duplicate_topic": 1},
                   "usage": {"calls": 1, "cache_hits": 0, "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.01}},
        "scores": {"planned": 2, "done": 2, "ok": 1, "skipped": 0, "discarded": {"autosubmission": 1},
                   "usage": {"calls": 7, "cache_hits": 1, "prompt_tokens": 70, "completion_tokens": 9, "cost_usd": 0.0}},
    }, "llm": {"requests_sent": 8}}
    page = summary_html(report, tmp_path / "summary.html").read_text()
    for text in ("topics", "duplicate_topic", "scores", "autosubmission", "0.0100", "<td>70</td>"):
        assert text in page, text
