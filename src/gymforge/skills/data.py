"""The data skill's sandbox side: `data.py validate FILE` and `data.py build OUT IN [IN ...] [--limit N]`.

validate: the format every row must have (rowformat.py: what train.py accepts), exact duplicates, prompts given two
different targets (a warning), and the row counts. The last line is `DATA_RESULT {json}` for the host, which adds
the check that needs the held-out prompts (overlap), never shown here.
build: the rows of the inputs in order, without malformed rows and exact duplicates, at most N, written to OUT as
they were written (one JSON object a line).

Standard library only; runs inside the agent's sandbox and imports nothing of gymforge.
"""

import json
import os
import sys

import rowformat


def _lines(pairs, what):
    shown = ", ".join(f"line {a} ({b})" if isinstance(b, str) else f"line {a} (repeats line {b})"
                      for a, b in pairs[: rowformat.MAX_REPORTED])
    more = f" and {len(pairs) - rowformat.MAX_REPORTED} more" if len(pairs) > rowformat.MAX_REPORTED else ""
    return f"{what}: {len(pairs)}: {shown}{more}"


def validate(path):
    rows, problems, duplicates, conflicts = rowformat.read(path)
    kinds = sorted({kind for _, kind, _ in rows})
    print(f"{path}: {len(rows)} usable rows ({', '.join(kinds) or 'none'})")
    if problems:
        print(_lines(problems, "format errors"))
    if duplicates:
        print(_lines(duplicates, "exact duplicates"))
    if conflicts:
        print(_lines([(a, f"same prompt as line {b}, another target") for a, b in conflicts],
                     "warning: conflicting targets"))
    if len(kinds) > 1:
        print("mixed row kinds: a file holds SFT rows or preference (DPO) rows, not both")
    result = {"rows": len(rows), "kinds": kinds, "format_errors": len(problems), "duplicates": len(duplicates),
              "duplicate_lines": [n for n, _ in duplicates], "conflicts": len(conflicts),
              "ok": bool(rows) and not problems and not duplicates and len(kinds) == 1}
    print("DATA_RESULT " + json.dumps(result))
    return 0 if result["ok"] else 1


def build(out, inputs, limit=None):
    seen, kept = set(), []
    dropped = {"format": 0, "duplicate": 0}
    for path in inputs:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    _, row = rowformat.normalise(json.loads(line))
                except (ValueError, RecursionError):
                    dropped["format"] += 1
                    continue
                key = json.dumps(row, sort_keys=True)
                if key in seen:
                    dropped["duplicate"] += 1
                    continue
                seen.add(key)
                kept.append(line.rstrip("\n"))
    kept = kept[:limit] if limit is not None else kept
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in kept)
    os.replace(tmp, out)
    print(f"wrote {len(kept)} rows to {out} (dropped {dropped['format']} malformed, {dropped['duplicate']} duplicate)")
    return 0


def main(argv):
    if len(argv) == 2 and argv[0] == "validate":
        return validate(argv[1])
    if len(argv) >= 3 and argv[0] == "build":
        args, limit = list(argv[1:]), None
        if "--limit" in args:
            i = args.index("--limit")
            limit = int(args[i + 1])
            del args[i:i + 2]
        if len(args) >= 2:
            return build(args[0], args[1:], limit)
    print("usage: data.py validate FILE | data.py build OUT IN [IN ...] [--limit N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
