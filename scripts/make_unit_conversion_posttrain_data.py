"""Writes the data of the built-in post-training task unitConversionPosttrain: metric unit conversions by powers
of ten, answered with the number alone. Synthetic and seeded; no network.

    python scripts/make_unit_conversion_posttrain_data.py

Each question converts a quantity (an integer from 2 to 99, or one with one decimal from 1.1 to 9.9) from a larger
metric unit to a smaller one (`CONVERSIONS`: x10, x100 or x1000). A seeded draw of distinct questions puts 40 in
the held-out evaluation set (test.jsonl, a secret file) and 300 in the training pool (data/train.jsonl); no
question is in both.
"""

import json
import random
from decimal import Decimal
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/gymforge/benchmark/tasks/data/unitConversionPosttrain"
HELD_OUT, POOL = 40, 300
QUESTION = "Convert {value} {unit} to {target}. Answer with the number only."
CONVERSIONS = (  # (from, to, factor)
    ("kilometres", "metres", 1000), ("metres", "centimetres", 100), ("centimetres", "millimetres", 10),
    ("kilograms", "grams", 1000), ("grams", "milligrams", 1000), ("litres", "millilitres", 1000),
    ("kilowatts", "watts", 1000), ("metres", "millimetres", 1000),
)


def main() -> None:
    rng = random.Random(0)
    values = [Decimal(v) for v in range(2, 100)] + [Decimal(v) / 10 for v in range(11, 100) if v % 10]
    questions = [(v, c) for v in values for c in CONVERSIONS]
    rows = []
    for value, (unit, target, factor) in rng.sample(questions, HELD_OUT + POOL):
        answer = value * factor
        rows.append({"prompt": QUESTION.format(value=value, unit=unit, target=target),
                     "answer": str(answer.to_integral_value() if answer == answer.to_integral_value() else answer)})
    for name, part in (("test.jsonl", rows[:HELD_OUT]), ("data/train.jsonl", rows[HELD_OUT:])):
        lines = [json.dumps({"id": i, **row}) for i, row in enumerate(part)]
        (OUT / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
