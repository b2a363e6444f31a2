"""`pytest --cpu-durations`: the profile that shows where the suite's CPU goes (tests/cpu_time.py)."""

from pathlib import Path

pytest_plugins = ["pytester"]


def test_the_test_whose_child_burned_cpu_comes_first(pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))  # where the plugin module lies
    pytester.makepyfile(test_two="""
import subprocess, sys, time

def test_waits():
    time.sleep(1.0)

def test_computes_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(range(20_000_000))"], check=True)
""")
    result = pytester.runpytest_subprocess("-p", "cpu_time", "--cpu-durations=1")
    result.assert_outcomes(passed=2)
    lines = result.stdout.lines
    header = next(i for i, line in enumerate(lines) if "most CPU" in line)
    assert "call" in lines[header + 1] and "test_computes_in_a_child" in lines[header + 1], lines[header:]
    assert not any("test_waits" in line for line in lines[header:])
