"""The verifier of a gymforge task exported as a Harbor task folder: `tests/verify.py` there (standard library only;
it imports nothing of gymforge, and runs where gymforge is not installed).

Usage: python3 verify.py TESTS APP LOGS

TESTS is the folder Harbor uploads to /tests: `meta.json` (how the task scores), `score.py` (gymforge's scorer
launcher, evalkit/score.py), `task/` (the task's pristine evaluation script, starter files and data) and
`answers/` (the held-out answers). APP is the agent's working directory (/app), LOGS the verifier's log folder
(/logs/verifier). The artefact (e.g. submission.csv) is copied out of APP, as a regular file only, into a fresh
folder beside the task's own files; the task's evaluation script scores it there as gymforge does (score.py, the
answers named by GYMFORGE_SECRETS, nothing of the agent's code importable); LOGS/reward.json gets the metric, the
baseline's score and `reward`: 0.5 + 0.5 * the clipped improvement over the baseline (0.5 for the baseline's
score, 1 for twice as good, 0 for no readable submission).
"""

import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile


def json_objects(text):
    """The JSON objects among the lines of `text` (gymforge.tasks.scoring.parse_metrics's rule)."""
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
    return found


def finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metrics_of(text):
    """The one distinct object of finite numbers the evaluation printed, or None."""
    candidates = [c for c in json_objects(text) if c and all(finite(v) for v in c.values())]
    distinct = {json.dumps(c, sort_keys=True) for c in candidates}
    return {k: float(v) for k, v in candidates[0].items()} if len(distinct) == 1 else None


def write(logs, rewards, note):
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(logs, "reward.json"), "w") as f:
        json.dump(rewards, f)
    with open(os.path.join(logs, "verify.txt"), "w") as f:
        f.write(note + "\n")
    print(json.dumps(rewards))


def main():
    tests, app, logs = sys.argv[1:4]
    with open(os.path.join(tests, "meta.json")) as f:
        meta = json.load(f)
    floor = {"reward": 0.0, "valid": 0}
    artefact = os.path.join(app, meta["artefact"])
    try:
        mode = os.lstat(artefact).st_mode
    except OSError:
        return write(logs, floor, "no artefact at " + artefact)
    if not stat.S_ISREG(mode):
        return write(logs, floor, meta["artefact"] + " is not a regular file")
    scorer = tempfile.mkdtemp(prefix="scorer-")
    out = tempfile.mkdtemp(prefix="out-")
    shutil.copytree(os.path.join(tests, "task"), scorer, dirs_exist_ok=True)
    shutil.copyfile(artefact, os.path.join(scorer, meta["artefact"]))
    argv = [a.replace("{scorer}", scorer) for a in meta["argv"]]
    command = [sys.executable, "-I", os.path.join(tests, "score.py"), out, "--answers", os.path.join(tests, "answers"),
               os.path.join(scorer, meta["script"]), *argv]
    try:
        done = subprocess.run(command, cwd=scorer, capture_output=True, text=True, timeout=meta["timeout_s"])
    except subprocess.TimeoutExpired:
        return write(logs, floor, "the evaluation ran past its timeout")
    texts = sorted(n for n in os.listdir(out) if n.startswith("stdout"))
    printed = "".join(open(os.path.join(out, n), errors="replace").read() for n in texts)
    try:
        with open(os.path.join(out, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        status = {}
    metrics = metrics_of(printed) if status.get("exit") == 0 else None
    if metrics is None:
        return write(logs, floor, "the evaluation gave no metrics:\n" + done.stderr[-2000:])
    name = meta["metric"] if meta["metric"] in metrics else next(iter(metrics))
    score, baseline = metrics[name], meta.get("baseline")
    rewards = {name: score, "valid": 1}
    improvement = 0.0
    if finite(baseline):
        rewards["baseline"] = baseline
        direction = 1.0 if meta["higher_is_better"] else -1.0
        improvement = direction * (score - baseline) / max(abs(baseline), meta["scale_floor"])
    rewards["reward"] = 0.5 + 0.5 * max(-1.0, min(1.0, improvement))
    write(logs, rewards, "scored " + json.dumps(metrics))


if __name__ == "__main__":
    main()
