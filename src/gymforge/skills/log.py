"""The plan, log and evaluate skills' entries in `experiment_log.md` (the workspace's experiment log).

  log.py plan TEXT          the plan of the next iteration (its number: the runs so far + 1)
  log.py note TEXT          a free note
  log.py eval SCORE [BASE]  a score of final_model/ (JSON objects), with the run final_model/ came from

train.py appends each run's entry itself. Standard library only; imports nothing of gymforge.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)
RUNS = os.path.join(WORKSPACE, "runs")
LOG = os.path.join(WORKSPACE, "experiment_log.md")
EXPORTED = os.path.join(RUNS, "final_model.txt")


def runs():
    try:
        return max((int(n) for n in os.listdir(RUNS) if n.isdigit()), default=0)
    except OSError:
        return 0


def source():
    try:
        with open(EXPORTED) as f:
            return f"run {int(f.read().strip())}"
    except (OSError, ValueError):
        return "not from a train run"


def append(text):
    fresh = not os.path.exists(LOG)
    with open(LOG, "a", encoding="utf-8") as f:
        if fresh:
            f.write("# Experiment log\n")
        f.write("\n" + text.rstrip("\n") + "\n")


def main(argv):
    if len(argv) == 2 and argv[0] == "plan":
        append(f"## Plan for iteration {runs() + 1}\n{argv[1].strip()}")
    elif len(argv) == 2 and argv[0] == "note":
        append(f"## Note (after {runs()} runs)\n{argv[1].strip()}")
    elif len(argv) in (2, 3) and argv[0] == "eval":
        score = json.loads(argv[1])
        base = f" (baseline {json.dumps(json.loads(argv[2]))})" if len(argv) == 3 else ""
        append(f"## Evaluation of final_model/ ({source()}, after {runs()} runs)\n- score: {json.dumps(score)}{base}")
    else:
        print("usage: log.py plan TEXT | log.py note TEXT | log.py eval SCORE [BASELINE]", file=sys.stderr)
        return 2
    print("appended to experiment_log.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
