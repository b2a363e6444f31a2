"""End to end (`all`, through `scores`) on a tiny offline config, then `snakemake --report`: every section is there,
and every text of the report (the first page, report/workflow.rst, and each figure's caption) renders without a
reStructuredText error."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gymforge.report.rl_plots import plot_curve
from gymforge.report.summary import summary_html
from gymforge.tools.status import collect
from finished_run import snakemake

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["Funnel", "Trajectories", "Training", "Scores"]
FILES = ["summary.html", "funnel.png", "kept_per_task.png", "trajectory_stats.png", "loss.png", "violins.png",
         "aup.png", "profiles.png"]
# What docutils writes into the HTML of a text it could not render (case-sensitive: its CSS classes are lowercase).
RST_ERRORS = ("System Message", "ERROR/3", "WARNING/2", "SEVERE/4", "Unknown", "Docutils")


def report_data(page: str) -> dict:
    """The data blocks of Snakemake's report page (`<script id="NAME">var x = <JSON>;</script>`): workflow-desc (the
    rendered report/workflow.rst), results (every figure, with its rendered caption), categories, ..."""
    blocks = re.findall(r'<script id="([\w-]+)">\s*var \w+ = (.*?);?\s*</script>', page, re.S)
    return {name: json.loads(value) for name, value in blocks}


def rst_errors(html: str) -> list[str]:
    return [marker for marker in RST_ERRORS if marker in html]


def categories_of_rules() -> dict[str, list[str]]:
    """Report category -> the rules files that declare it (`category="N. Name"`)."""
    found: dict[str, list[str]] = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for name in re.findall(r'category="([^"]+)"', smk.read_text()):
            found.setdefault(name, []).append(smk.name)
    return found


def numbered_without_gaps(names) -> bool:
    numbers = sorted({int(name.split(".", 1)[0]) for name in names})
    return numbers == list(range(1, len(numbers) + 1))


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


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_report_texts_render_without_restructuredtext_errors(finished):
    data = report_data((finished / "report.html").read_text())
    description = data["workflow-desc"]
    assert not rst_errors(description), description
    # the seed the run used (config.yaml holds only overrides: the Snakefile puts the resolved one into `config`)
    seed = json.loads((finished / "results" / "config.json").read_text())["seed"]
    assert f'seed <tt class="docutils literal">{seed}</tt>' in description, description
    assert "results/config.json" in description
    for path, result in data["results"].items():
        assert result["caption"].strip() and not rst_errors(result["caption"]), (path, result["caption"])
    # categories: numbered from 1 without a gap, in the order of the stages
    assert sorted(data["categories"]) == ["1. Funnel", "2. Trajectories", "3. Training", "4. Scores"]
    # the AUP table with its intervals, in the run summary the report opens with
    summary = (finished / "results" / "report" / "summary.html").read_text()
    assert "AUP with 95% intervals" in summary and "student-sft - student-base" in summary


def test_report_categories_are_numbered_without_gaps():
    """Every category a rule puts a figure in (the report lists them sorted by name) is `N. Name`, numbered 1, 2, ...
    without a gap, with or without the RL stage's (category 5, only when the report includes target rl)."""
    categories = categories_of_rules()
    assert all(re.fullmatch(r"\d+\. \S.*", name) for name in categories), categories
    assert numbered_without_gaps(categories), categories
    assert numbered_without_gaps(name for name, files in categories.items() if files != ["rl.smk"]), categories
    assert categories["5. On-policy RL"] == ["rl.smk"]


def test_every_report_text_is_valid_restructuredtext():
    """report/*.rst rendered as Snakemake renders them (Jinja with the resolved `snakemake.config`, then docutils):
    no system message, whatever the run (the captions of target rl included, which the finished run lacks)."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    from gymforge.core.config import GymforgeConfig

    class Snakemake:
        config = GymforgeConfig().model_dump()

    texts = sorted((REPO / "report").glob("*.rst"))
    assert {t.name for t in texts} >= {"workflow.rst", "rl.rst", "scores.rst", "summary.rst"}
    rendered = {}
    for text in texts:
        source = Environment().from_string(text.read_text()).render(snakemake=Snakemake, categories={}, files=[])
        rendered[text.name] = publish_parts(source, writer="html")["html_body"]
        assert not rst_errors(rendered[text.name]), (text.name, rendered[text.name])
    assert 'seed <tt class="docutils literal">0</tt>' in rendered["workflow.rst"]


def test_rl_curve_plot_and_summary_aup_table(tmp_path):
    """The RL figure (rule rl_plot) and the run summary's AUP table with intervals, from their JSON files."""
    curve = tmp_path / "rl" / "tiny" / "curve.json"
    curve.parent.mkdir(parents=True)
    rows = [{"iteration": i, "mean_reward": 0.1 * i, "valid_share": 0.5, "mean_duration_s": 1.0, "kl": 0.0}
            for i in range(3)]
    curve.write_text(json.dumps({"iterations": rows, "first_quarter_mean_reward": 0.0,
                                 "last_quarter_mean_reward": 0.2}))
    png = plot_curve(curve, tmp_path / "curve.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    curve.write_text(json.dumps({"iterations": []}))  # a run killed before its first iteration still plots
    assert plot_curve(curve, tmp_path / "empty.png").read_bytes().startswith(b"\x89PNG")

    ci = {"estimate": 0.5, "ci": [0.4, 0.6]}
    scores = {"bootstrap": {"level": 0.95, "samples": 1000, "seed": 0,
                            "aup": {"teacher": {"best_aup": ci, "last_aup": ci},
                                    "student-sft": {"best_aup": {"estimate": 0.3, "ci": [0.2, 0.35]}, "last_aup": ci}},
                            "differences": {"student-sft - student-base": {"best_aup": {"estimate": 0.1,
                                                                                         "ci": [-0.05, 0.2]},
                                                                            "last_aup": ci}}}}
    (tmp_path / "scores").mkdir()
    (tmp_path / "scores" / "scores.json").write_text(json.dumps(scores))
    report = {"stages": {}, "llm": {"requests_sent": 0}}
    page = summary_html(report, tmp_path / "summary.html", results=tmp_path).read_text()
    assert "AUP with 95% intervals" in page
    for cell in ("0.500 [0.400, 0.600]", "0.300 [0.200, 0.350]", "+0.100 [-0.050, +0.200]"):
        assert cell in page, cell
    assert page.index("teacher") < page.index("<td>student-sft</td>")  # best first

