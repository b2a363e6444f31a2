"""Scores final_model/ on the held-out dates: greedy generation, exact match; prints {"accuracy": ...}.

A reply counts when its first line, without surrounding spaces, quotes, backticks and a final full stop, is the
date in ISO 8601 (YYYY-MM-DD).
"""

import contextlib
import json
import os
import re
import sys

try:  # gymforge runs the generation in a sandbox of its own (the model only) and hands it over through gymforge_eval
    from gymforge_eval import import_submission
except ImportError:  # under MLGym the generation module is imported into this process
    from importlib import import_module as import_submission

HERE = os.path.dirname(os.path.abspath(__file__))
# gymforge keeps the held-out questions outside the workspace and names their directory in GYMFORGE_SECRETS.
SECRETS = os.environ.get("GYMFORGE_SECRETS", HERE)
MAX_NEW_TOKENS = 10


def normalise(text):
    text = str(text or "").strip()
    first = text.splitlines()[0] if text else ""
    return re.sub(r"\s+", " ", first).strip(" \t.\"'`*")


def main():
    with open(os.path.join(SECRETS, "test.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with contextlib.redirect_stdout(sys.stderr):  # the generation's prints go to stderr
        replies = import_submission("generate").generate("final_model", [r["prompt"] for r in rows], MAX_NEW_TOKENS)
    if not isinstance(replies, list) or len(replies) != len(rows):
        raise ValueError("the generation returned no reply per question")
    correct = sum(isinstance(y, str) and normalise(y) == r["answer"] for y, r in zip(replies, rows))
    print(json.dumps({"accuracy": round(correct / len(rows), 6)}))


if __name__ == "__main__":
    main()
