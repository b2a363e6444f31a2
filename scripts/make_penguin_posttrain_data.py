"""Writes the data of the built-in post-training task penguinSpeciesPosttrain from palmerpenguins (the offline extra).

    python scripts/make_penguin_posttrain_data.py

Rows with a missing measurement are dropped (342 of 344 remain); a seeded shuffle puts 40 in the held-out
evaluation set (test.jsonl, a secret file) and the rest in the training pool (data/train.jsonl).
"""

import json
import random
from pathlib import Path

import palmerpenguins

OUT = Path(__file__).resolve().parents[1] / "src/gymforge/benchmark/tasks/data/penguinSpeciesPosttrain"
HELD_OUT = 40
QUESTION = ("Penguin from {island} island: bill {bill_length_mm:g} x {bill_depth_mm:g} mm, flipper "
            "{flipper_length_mm:g} mm, {body_mass_g:g} g. Species (Adelie, Chinstrap or Gentoo)?")


def main() -> None:
    frame = palmerpenguins.load_penguins().dropna(subset=["bill_length_mm", "bill_depth_mm", "flipper_length_mm",
                                                          "body_mass_g"])
    rows = [{"prompt": QUESTION.format(**r), "answer": r["species"]} for r in frame.to_dict("records")]
    random.Random(0).shuffle(rows)
    for name, part in (("test.jsonl", rows[:HELD_OUT]), ("data/train.jsonl", rows[HELD_OUT:])):
        lines = [json.dumps({"id": i, **row}) for i, row in enumerate(part)]
        (OUT / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
