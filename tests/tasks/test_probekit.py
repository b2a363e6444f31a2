"""The evaluator probes' sandbox-side programs (gymforge/tasks/probekit/), run as a probe's workspace runs them: the
Python wrapper imported in place of a submission module, in a fresh interpreter, and the model wrapper unpickled
from the probe's pickle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from gymforge.tasks import probekit, probes
from gymforge.tasks.probekit import model_probe, python_probe

BASELINE = '''
import random

SIZE = 3
LOADED = random.random()  # runs once, when the wrapper loads this module


def _helper(n):
    return list(range(n))


def pick(items):
    return [x * 2 for x in items]


def table(keys):
    return {k: i + 1 for i, k in enumerate(keys)}


def score(items):
    return 1.5


def nothing(items):
    return []


def arrays(n):
    import numpy
    return numpy.arange(1, n + 1, dtype="int64")
'''


def _workspace(tmp_path: Path, transform: str) -> Path:
    """A probe's files as `probes.python_probes` writes them for a submission module `strategy.py`."""
    made = {p.name: p for p in probes.python_probes("strategy.py", BASELINE.encode())}
    for rel, data in made[transform].files.items():
        (tmp_path / rel).write_bytes(data)
    return tmp_path


def _call(folder: Path, expression: str) -> subprocess.CompletedProcess:
    """`expression` evaluated after `import strategy` in a fresh interpreter whose working directory is `folder`;
    its value printed as JSON."""
    code = f"import json, strategy\nprint(json.dumps({expression}, default=lambda v: v.tolist()))"
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=60)


def _value(folder: Path, expression: str):
    proc = _call(folder, expression)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_probe_writes_the_program_its_baseline_and_its_settings(tmp_path: Path) -> None:
    made = {p.name: p for p in probes.python_probes("src/strategy.py", BASELINE.encode())}
    assert set(made) == set(probes.PYTHON_TRANSFORMS)
    files = made["zeros"].files
    assert files["src/strategy.py"] == (b'"""gymforge evaluator probe: pick, table, score, nothing, arrays return the '
                                        b"baseline's answer with every number set to 0.\"\"\"\n" + probekit.program("python_probe.py"))
    assert files["src/_gymforge_original.py"] == BASELINE.encode()
    settings = json.loads(files["src/_gymforge_probe.json"])
    assert settings == {"original": "_gymforge_original", "functions": ["pick", "table", "score", "nothing", "arrays"],
                        "transform": "zeros", "not_applicable": probes.NOT_APPLICABLE_EXIT}


@pytest.mark.parametrize(("transform", "expression", "expected"), [
    ("zeros", "strategy.pick([1, 2.5])", [0, 0.0]),
    ("ones", "strategy.table(['a', 'b'])", {"a": 1, "b": 1}),
    ("huge", "strategy.pick([1])", [10**12]),
    ("negative_huge", "strategy.arrays(2)", [-(10**12)] * 2),
    ("first_repeated", "strategy.table(['a', 'b', 'c'])", {"a": 1, "b": 1, "c": 1}),
    ("empty", "strategy.pick([1, 2])", []),
    ("all_indices", "strategy.pick([5, 6, 7])", [0, 1, 2]),
    ("echo", "strategy.pick([5, 6])", [5, 6]),
    ("none", "strategy.score([1])", None),
])
def test_the_wrapper_answers_degenerately(tmp_path: Path, transform: str, expression: str, expected) -> None:
    assert _value(_workspace(tmp_path, transform), expression) == expected


def test_the_wrapped_module_keeps_the_baseline_names_and_loads_it_once(tmp_path: Path) -> None:
    folder = _workspace(tmp_path, "zeros")
    assert _value(folder, "[strategy.SIZE, strategy._helper(2), strategy.pick.__name__]") == [3, [0, 1], "pick"]
    assert _value(folder, "strategy.LOADED == __import__('_gymforge_original').LOADED")
    assert _value(folder, "str(strategy.arrays(2).dtype)") == "int64"  # an array keeps its dtype


@pytest.mark.parametrize(("transform", "expression", "why"), [
    ("zeros", "strategy.score([1])", "the function returns a number"),  # a number's zero may be a fair answer
    ("empty", "strategy.nothing([1])", "the answer has no such degenerate form"),  # [] is already empty
])
def test_a_transform_without_a_degenerate_form_exits_not_applicable(tmp_path: Path, transform: str, expression: str,
                                                                     why: str) -> None:
    proc = _call(_workspace(tmp_path, transform), expression)
    assert proc.returncode == probes.NOT_APPLICABLE_EXIT
    assert f"not applicable ({why})" in proc.stderr and proc.stdout == ""


def test_only_the_first_answer_is_compared_with_the_baseline(tmp_path: Path) -> None:
    # pick([1]) -> [0] differs from [2]; a later answer that zeros leave unchanged is still returned.
    assert _value(_workspace(tmp_path, "zeros"), "[strategy.pick([1]), strategy.pick([0])]") == [[0], [0]]


def test_set_numbers_is_the_one_helper_host_and_sandbox_share() -> None:
    # On the host the module loads nothing (no baseline beside it) and serves the config probes.
    config = {"model_path": "m.pkl", "bandwidth": 0.5, "layers": [2, 3], "nested": {"seed": 1, "fit": True}}
    assert python_probe.set_numbers(config, 0) == {"model_path": "m.pkl", "bandwidth": 0.0, "layers": [0, 0],
                                                   "nested": {"seed": 0, "fit": True}}
    assert python_probe.set_numbers((1, [2.0]), 7) == (7, [7.0])
    made = probes.model_probes("cfg/model.yaml", b"bandwidth: 0.5\nname: kde\n")
    assert [p.name for p in made] == ["config_zeros", "config_huge", "config_negative_huge"]
    assert made[1].files["cfg/model.yaml"] == b"bandwidth: 1000000000000.0\nname: kde\n"


def test_degrade_spoils_each_model_transform() -> None:
    predictions = numpy.array([3.0, 1.0, 2.0, 6.0])
    shapes = {t: model_probe.degrade(predictions, t).shape for t in probes.MODEL_TRANSFORMS}
    assert shapes == {"constant_first": (4,), "zeros": (4,), "mean": (4,), "short": (3,), "first_half": (2,),
                      "two_columns": (4, 2), "empty": (0,), "nan": (4,)}
    assert model_probe.degrade(predictions, "constant_first").tolist() == [3.0] * 4
    assert model_probe.degrade(predictions, "mean").tolist() == [3.0] * 4
    assert numpy.isnan(model_probe.degrade(predictions, "nan")).all()
    assert model_probe.degrade(numpy.array(["a", "b"]), "mean").tolist() == ["a", "b"]  # labels have no mean


MODEL = '''
class Doubler:
    def predict(self, x):
        return [2 * v for v in x]

    def predict_proba(self, x):
        return [[0.25, 0.75] for _ in x]

    classes_ = [0, 1]
'''


def test_the_probe_pickle_wraps_the_baseline_model(tmp_path: Path) -> None:
    (tmp_path / "doubler.py").write_text(MODEL)
    (tmp_path / "models").mkdir()
    subprocess.run([sys.executable, "-c", "import pickle, doubler\npickle.dump(doubler.Doubler(), "
                    "open('models/model.pkl', 'wb'))"], cwd=tmp_path, check=True, timeout=60)
    probe = next(p for p in probes.model_probes("models/config.yaml", b"model_path: model.pkl\n")
                 if p.name == "first_half")
    for rel, data in probe.files.items():
        (tmp_path / rel).write_bytes(data)
    assert (tmp_path / "_gymforge_probe.py").read_bytes() == probekit.program("model_probe.py")
    code = ("import json, pickle\nm = pickle.load(open('models/_gymforge_probe.pkl', 'rb'))\n"
            "print(json.dumps([m.predict([1, 2, 3, 4]).tolist(), m.predict_proba([1, 2]).tolist(), m.classes_]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the baseline's pickle was found beside the config (models/model.pkl), not in the working directory
    assert json.loads(proc.stdout) == [[2, 4], [[0.25, 0.75]], [0, 1]]
