"""The evaluator probes' sandbox-side programs (`gymforge.tasks.probes` writes them into a probe's workspace).

- `python_probe.py`: stands in for a Python submission's module: it loads the baseline's module, renamed beside
  it, and wraps its public functions so that they answer degenerately. Its settings come from the JSON file
  `python_probe.PARAMS` beside it.
- `model_probe.py`: a pickled model's wrapper whose `predict` and `predict_proba` answer degenerately.

Both run in the submission's sandbox, never on the host, and import nothing of gymforge. The host reads them as text
(`program`); it imports only `python_probe.set_numbers`, which runs no submission code.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def program(name: str) -> bytes:
    """The bytes of the program file `name` (e.g. "python_probe.py"), as a probe writes it."""
    return (HERE / name).read_bytes()
