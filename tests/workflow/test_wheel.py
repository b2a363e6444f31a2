"""The built wheel, not the checkout: `pip wheel .` packs every file of the package, and an interpreter that
sees only the installed wheel (plus this environment's dependencies) renders every prompt template, finds the
accelerate configs and lists one `gymforge` verb per step."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from gymforge.cli import STEPS

REPO = Path(__file__).resolve().parents[2]

# Runs in the fresh interpreter: everything it imports from gymforge must come from the wheel.
PROBE = r'''
import json, subprocess, sys
import jinja2.meta
import gymforge
from gymforge.core import prompts
from gymforge.runtime.launch import STRATEGY_FILES, accelerate_config


class Anything(str):
    """A value for any template variable: a string, a mapping with one item, an object with any attribute."""

    def __new__(cls, name):
        return super().__new__(cls, f"<{name}>")

    def __getattr__(self, attr):
        return Anything(attr)

    def items(self):
        return [(Anything("key"), Anything("value"))]


env = prompts._environment(str(prompts.templates_dir()))
rendered = {}
for path in sorted(prompts.templates_dir().glob("*.j2")):
    name = path.name[:-len(".j2")]
    needed = jinja2.meta.find_undeclared_variables(env.parse(path.read_text()))
    rendered[name] = prompts.render(name, **{v: Anything(v) for v in needed})
help_text = subprocess.run([sys.executable, "-m", "gymforge", "--help"], capture_output=True, text=True, check=True)
print(json.dumps({
    "gymforge": gymforge.__file__,
    "templates_dir": str(prompts.templates_dir()),
    "rendered": rendered,
    "topics": prompts.render("topics", n=3, seen=["graph coloring"]),
    "accelerate": {s: str(accelerate_config(s)) for s in STRATEGY_FILES},
    "help": help_text.stdout,
}))
'''


def _build_wheel(tmp: Path) -> Path:
    """`pip wheel . --no-deps` on a copy of the project (an in-tree build would write build/ into the checkout)."""
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, project / name)
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    cmd = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(tmp / "dist")]
    try:  # the build backend is already here: no download (otherwise pip fetches setuptools as usual)
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 68:
            cmd.append("--no-build-isolation")
    except ImportError:
        pass
    subprocess.run(cmd, cwd=project, check=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("gymforge-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_installs_and_renders_without_the_checkout(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)

    # every file the package tracks is in the wheel (package-data: templates, accelerate configs, evalkit,
    # the built-in benchmark's configs and data)
    packed = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "src/gymforge"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        missing = [f for f in tracked.stdout.split() if f.removeprefix("src/") not in packed]
        assert not missing, f"not in the wheel: {missing}"
    templates = sorted(p.name for p in (REPO / "src/gymforge/core/templates").glob("*.j2"))
    assert templates and all(f"gymforge/core/templates/{t}" in packed for t in templates)
    # the programs the offline teacher writes (gymforge.offline.families.common.program)
    programs = sorted(p.name for p in (REPO / "src/gymforge/offline/programs").glob("*.j2"))
    assert programs and all(f"gymforge/offline/programs/{t}" in packed for t in programs)

    # the wheel installed on its own; dependencies from this environment's site-packages on PYTHONPATH, where
    # the editable install's .pth (which would put the checkout's src/ first) is not read
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1",
           "PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}"}
    done = subprocess.run([str(python), "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    assert Path(got["gymforge"]).is_relative_to(site), got["gymforge"]  # not the checkout
    assert Path(got["templates_dir"]).is_relative_to(site)
    assert sorted(f"{name}.j2" for name in got["rendered"]) == templates
    assert all(text.strip() for text in got["rendered"].values())
    assert "Propose exactly 3" in got["topics"] and "- graph coloring" in got["topics"]
    ddp = Path(got["accelerate"]["ddp"])
    assert ddp.is_relative_to(site) and ddp.read_text() == (REPO / "src/gymforge/runtime/accelerate/ddp.yaml").read_text()
    assert all(Path(p).is_file() for p in got["accelerate"].values())
    verbs = re.findall(r"^ {4}(\S+)", got["help"], flags=re.MULTILINE)  # argparse's subcommand rows
    missing_verbs = [v for v in STEPS if v not in verbs]
    assert not missing_verbs, f"gymforge --help from the wheel lacks {missing_verbs}:\n{got['help']}"
