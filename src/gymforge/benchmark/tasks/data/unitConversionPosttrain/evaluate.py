"""Scores final_model/ on the held-out conversions: greedy generation, the reply's number; prints {"accuracy": ...}.

A reply counts when its first line is a number, optionally followed by the unit (e.g. "4500" or "4500 metres"),
equal to the answer. Thousands separators (commas, spaces) are accepted; a reply with anything else before the
number ("4.5 km is 4500 m") does not count.
"""

import contextlib
import json
import os
import re
import sys
from decimal import Decimal, InvalidOperation

try:  # gymforge runs the generation in a sandbox of its own (the model only) and hands it over through gymforge_eval
    from gymforge_eval import import_submission
except ImportError:  # under MLGym the generation module is imported into this process
    from importlib import import_module as import_submission

HERE = os.path.dirname(os.path.abspath(__file__))
# gymforge keeps the held-out questions outside the workspace and names their directory in GYMFORGE_SECRETS.
SECRETS = os.environ.get("GYMFORGE_SECRETS", HERE)
MAX_NEW_TOKENS = 6
NUMBER = re.compile(r"^(-?\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?)(?:\s*[a-zA-Z]+)?[.]?$")


def parse(text):
    """The number a reply's first line states, or None."""
    text = str(text or "").strip()
    first = text.splitlines()[0].strip(" \t\"'`*") if text else ""
    match = NUMBER.match(first)
    if not match:
        return None
    try:
        return Decimal(match.group(1).replace(",", "").replace(" ", ""))
    except InvalidOperation:
        return None


def main():
    with open(os.path.join(SECRETS, "test.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with contextlib.redirect_stdout(sys.stderr):  # the generation's prints go to stderr
        replies = import_submission("generate").generate("final_model", [r["prompt"] for r in rows], MAX_NEW_TOKENS)
    if not isinstance(replies, list) or len(replies) != len(rows):
        raise ValueError("the generation returned no reply per question")
    correct = sum(isinstance(y, str) and parse(y) == Decimal(r["answer"]) for y, r in zip(replies, rows))
    print(json.dumps({"accuracy": round(correct / len(rows), 6)}))


if __name__ == "__main__":
    main()
