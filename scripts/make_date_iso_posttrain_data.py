"""Writes the data of the built-in post-training task dateIsoPosttrain: dates written out in words, to rewrite as
ISO 8601 (YYYY-MM-DD). Synthetic and seeded; no network.

    python scripts/make_date_iso_posttrain_data.py

Every date between 1950 and 2049 can be drawn; each question writes it in one of five wordings (`STYLES`). A
seeded draw of distinct dates puts 40 in the held-out evaluation set (test.jsonl, a secret file) and 300 in the
training pool (data/train.jsonl); no date is in both.
"""

import datetime
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/gymforge/benchmark/tasks/data/dateIsoPosttrain"
HELD_OUT, POOL = 40, 300
QUESTION = "Rewrite the date {date} in ISO 8601 format (YYYY-MM-DD)."
ORDINAL = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd", 31: "st"}
STYLES = (
    lambda d: f"{d:%B} {d.day}, {d.year}",                                # March 5, 2021
    lambda d: f"{d.day} {d:%B} {d.year}",                                 # 5 March 2021
    lambda d: f"{d:%b}. {d.day}, {d.year}" if d.month != 5 else f"May {d.day}, {d.year}",  # Mar. 5, 2021
    lambda d: f"the {d.day}{ORDINAL.get(d.day, 'th')} of {d:%B} {d.year}",  # the 5th of March 2021
    lambda d: f"{d:%A}, {d:%B} {d.day}, {d.year}",                        # Friday, March 5, 2021
)


def main() -> None:
    rng = random.Random(0)
    start, days = datetime.date(1950, 1, 1), (datetime.date(2049, 12, 31) - datetime.date(1950, 1, 1)).days
    dates = [start + datetime.timedelta(days=k) for k in rng.sample(range(days + 1), HELD_OUT + POOL)]
    rows = [{"prompt": QUESTION.format(date=rng.choice(STYLES)(d)), "answer": d.isoformat()} for d in dates]
    for name, part in (("test.jsonl", rows[:HELD_OUT]), ("data/train.jsonl", rows[HELD_OUT:])):
        lines = [json.dumps({"id": i, **row}) for i, row in enumerate(part)]
        (OUT / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
