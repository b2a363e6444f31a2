"""The training rows the skills accept, shared by `data.py` (validation) and `train.py` (training).

One JSON object a line (blank lines skipped), one of:
- SFT: {"prompt": str, "completion": str}, {"prompt": str, "answer": str} (the task's pool), or
  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]} ending with the assistant's turn;
- DPO (preferences): {"prompt": str, "chosen": str, "rejected": str}.
Every row becomes TRL's conversational form: the prompt as chat turns (a string is one user turn, as the task's
generation renders its questions), the completion (or chosen and rejected) as one assistant turn.

Standard library only; runs inside the agent's sandbox and imports nothing of gymforge.
"""

import json

ROLES = ("system", "user", "assistant")
MAX_REPORTED = 10  # line numbers listed per problem


def _text(value):
    return isinstance(value, str) and value.strip() != ""


def normalise(row):
    """(kind, row in TRL's conversational form) of one parsed line, or raise ValueError saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or len(messages) < 2:
            raise ValueError("'messages' must be a list of at least two turns")
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not _text(m.get("content")):
                raise ValueError("each message needs a role (system, user or assistant) and non-empty content")
        if messages[-1]["role"] != "assistant" or not any(m["role"] == "user" for m in messages[:-1]):
            raise ValueError("'messages' must hold a user turn and end with the assistant's turn")
        turns = [{"role": m["role"], "content": m["content"]} for m in messages]
        return "sft", {"prompt": turns[:-1], "completion": turns[-1:]}
    if not _text(row.get("prompt")):
        raise ValueError("no non-empty 'prompt' string (or 'messages')")
    prompt = [{"role": "user", "content": row["prompt"]}]
    if "chosen" in row or "rejected" in row:
        if not (_text(row.get("chosen")) and _text(row.get("rejected"))):
            raise ValueError("a preference row needs non-empty 'chosen' and 'rejected' strings")
        if row["chosen"].strip() == row["rejected"].strip():
            raise ValueError("'chosen' and 'rejected' are the same")
        return "dpo", {"prompt": prompt, "chosen": [{"role": "assistant", "content": row["chosen"]}],
                       "rejected": [{"role": "assistant", "content": row["rejected"]}]}
    target = row.get("completion", row.get("answer"))
    if not _text(target):
        raise ValueError("no non-empty 'completion' (or 'answer') string")
    return "sft", {"prompt": prompt, "completion": [{"role": "assistant", "content": target}]}


def read(path):
    """Everything validation and training need to know of a file: rows (line number, kind, normalised row),
    format problems (line number, reason), exact duplicates (line number, the line it repeats), prompts with two
    different targets (line number, the line it contradicts)."""
    rows, problems, duplicates, conflicts = [], [], [], []
    first, targets = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                kind, row = normalise(json.loads(line))
            except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
                reason = "not valid JSON" if isinstance(err, json.JSONDecodeError) else str(err) or "unreadable"
                problems.append((n, reason))
                continue
            key = json.dumps(row, sort_keys=True)
            if key in first:
                duplicates.append((n, first[key]))
                continue
            first[key] = n
            prompt = json.dumps(row["prompt"], sort_keys=True)
            target = json.dumps({k: v for k, v in row.items() if k != "prompt"}, sort_keys=True)
            if prompt in targets and targets[prompt][1] != target:
                conflicts.append((n, targets[prompt][0]))
            targets.setdefault(prompt, (n, target))
            rows.append((n, kind, row))
    return rows, problems, duplicates, conflicts
