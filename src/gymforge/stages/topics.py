"""Topics stage: sample research topics in batches, de-duplicate them, and give each slot a stable id."""

from __future__ import annotations

import json
from pathlib import Path

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.dedup import find_duplicate, normalise
from gymforge.core.prompts import render
from gymforge.core.records import TopicBatch, TopicSlot, UsageRecord, derive_seed, text_hash
from gymforge.llm.json_reply import NotJSON, ask_for_json
from gymforge.core.plan import batch_id, batch_of_slot, slot_id  # noqa: F401  (re-exported)
from gymforge.llm.client import make_client

MAX_TOPIC_CHARS = 200


def _clean(items: list) -> list[str]:
    return [str(x).strip() for x in items if isinstance(x, str) and x.strip()]


def topic_batch(cfg: GymforgeConfig, batch: str, previous: Path | None, out: Path) -> TopicBatch:
    """Ask the teacher for one batch, then fill this batch's slots with unique topics or discard reasons."""
    index = int(batch[1:])
    prev = TopicBatch.model_validate_json(previous.read_text()) if previous else None
    seen = list(prev.seen) if prev else []
    n = cfg.topics.batch_size
    messages = [
        {"role": "system", "content": render("system_teacher")},
        {"role": "user", "content": render("topics", n=n, seen=seen, kind=cfg.topics.kind)},
    ]
    seed = derive_seed(cfg.seed, "topics", batch)
    with make_client(cfg, "topics") as client:
        try:
            raw, nudges = ask_for_json(
                lambda m: client.chat(m, seed=seed), messages, list,
                shape=f"array of {n} topic strings", max_nudges=cfg.topics.max_nudges,
                validate=_clean,
            )
            failure = None
        except NotJSON as err:
            raw, nudges, failure = [], cfg.topics.max_nudges, str(err)
        usage = UsageRecord.model_validate(client.usage.model_dump())

    # Dedup runs against every topic accepted so far, including earlier ones in this batch.
    accepted = [(f"seen:{i}", t) for i, t in enumerate(seen)]
    slots = []
    for offset in range(n):
        sid = slot_id(index * n + offset)
        if offset >= len(raw):
            code, why = ("invalid_json", f"teacher gave no usable topics: {failure}") if failure else (
                "short_batch", f"teacher returned {len(raw)} topics for a batch of {n}")
            slots.append(TopicSlot(item=sid, status="discarded", reason_code=code, reason=why))
            continue
        topic = raw[offset][:MAX_TOPIC_CHARS]
        dup = find_duplicate(topic, accepted, cfg.topics.similarity_threshold)
        if dup is not None:
            original = dict(accepted)[dup]
            slots.append(TopicSlot(item=sid, status="discarded", topic=topic, duplicate_of=original,
                                   reason_code="duplicate_topic", reason=f"duplicate of already sampled topic {original!r}"))
            continue
        accepted.append((sid, topic))
        slots.append(TopicSlot(item=sid, status="ok", topic=topic, topic_hash=text_hash(normalise(topic))))

    result = TopicBatch(batch=batch, requested=n, raw=raw, slots=slots, nudges=nudges, usage=usage,
                        seen=seen + [s.topic for s in slots if s.status == "ok"])
    atomic.write_text(out, result.model_dump_json(indent=2))
    return result


def load_slot(batch_file: Path, slot: str) -> TopicSlot:
    batch = TopicBatch.model_validate(json.loads(Path(batch_file).read_text()))
    for s in batch.slots:
        if s.item == slot:
            return s
    raise KeyError(f"slot {slot} is not in {batch_file}")
