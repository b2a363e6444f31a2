"""The transformers server decodes concurrent requests together: a reply in a batch is the reply the same request
gets alone (greedy: the same token ids as `generate`; seeded sampling: the same draws), with each request's own
sampling parameters, stop strings and token cap; requests join a running batch between tokens."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest

from gymforge.core.config import GymforgeConfig
from gymforge.llm.batching import BatchDecoder
from gymforge.llm.serving import ChatModel, serve_checkpoint, transformers_command
from gymforge.student import base as student
from gymforge.student.tokenizer import train_offline_tokenizer

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}
PROMPTS = ["hello", "the quick brown fox jumps over the lazy dog " * 4, "ls -la data/",
           "DISCUSSION hello world the quick brown", "fox " * 25]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen3 whose greedy replies vary from token to token (weights drawn with standard deviation 0.5:
    at the usual 0.02 every reply repeats one token, which would make equal replies prove little) and run to their
    token cap (the eos embedding, tied to its output row, is zero)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("batch")
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", "ls -la data/", "DISCUSSION"]
    train_offline_tokenizer(texts, vocab_size=320).save_pretrained(str(root / "tok"))
    student.build_base(GymforgeConfig.model_validate({"train": {"tiny": TINY}}), root / "tok", root / "base")
    model = AutoModelForCausalLM.from_pretrained(str(root / "base"))
    torch.manual_seed(0)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.normal_(0, 0.5)
        model.get_input_embeddings().weight[model.config.eos_token_id].zero_()
    model.config.max_position_embeddings = 160
    model.save_pretrained(str(root / "ckpt"))
    AutoTokenizer.from_pretrained(str(root / "base")).save_pretrained(str(root / "ckpt"))
    return root / "ckpt"


@pytest.fixture(scope="module")
def chat(checkpoint: Path) -> ChatModel:
    return ChatModel(str(checkpoint), "tiny", max_new_tokens=40, max_batch=8, device="cpu")


def body(prompt: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "return_token_ids": True, **kw}


def batch_sizes(chat: ChatModel, monkeypatch: pytest.MonkeyPatch,
                waiting: int = 0) -> tuple[list[int], threading.Event]:
    """Record the rows of every decoding step; the event is set once the batch has taken three steps, and that step
    ends once `waiting` requests wait to join (so that they join together)."""
    sizes: list[int] = []
    stepped = threading.Event()
    sample = chat.decoder._sample

    def spy(rows: list[Any], logits: Any) -> Any:
        sizes.append(len(rows))
        if len(sizes) == 3:
            stepped.set()
            deadline = time.monotonic() + 30
            while len(chat.decoder._pending) < waiting and time.monotonic() < deadline:
                time.sleep(0.01)
        return sample(rows, logits)

    monkeypatch.setattr(chat.decoder, "_sample", spy)
    return sizes, stepped


def concurrently(chat: ChatModel, bodies: list[dict[str, Any]], stepped: threading.Event) -> list[dict[str, Any]]:
    """The first request starts alone; the others are sent once it has decoded a few tokens (they join it)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        first = pool.submit(chat.complete, bodies[0])
        assert stepped.wait(60)
        rest = [pool.submit(chat.complete, b) for b in bodies[1:]]
        return [first.result(60), *(f.result(60) for f in rest)]


@pytest.mark.parametrize("prefill_tokens", [8192, 30], ids=["batched-prefill", "prefills-of-30-tokens"])
def test_greedy_replies_in_a_batch_are_generates_replies(chat: ChatModel, monkeypatch: pytest.MonkeyPatch,
                                                         prefill_tokens: int) -> None:
    import torch

    monkeypatch.setattr(chat.decoder, "prefill_tokens", prefill_tokens)  # 30: every prompt (19 tokens or more) alone

    bodies = [body(p, temperature=0, max_tokens=12 + 5 * i, logprobs=True) for i, p in enumerate(PROMPTS)]
    expected = []
    for b in bodies:  # the reference: transformers' generate, one request at a time
        ids = torch.tensor([chat.prompt_ids(b)])
        out = chat.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=b["max_tokens"],
                                  do_sample=False, eos_token_id=chat.eos_ids, pad_token_id=chat.pad_id,
                                  output_scores=True, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:].tolist()
        expected.append((ids.shape[1], new, [float(torch.log_softmax(s[0].float(), -1)[t])
                                             for t, s in zip(new, out.scores, strict=True)]))
    sizes, stepped = batch_sizes(chat, monkeypatch, waiting=len(bodies) - 1)
    prefills: list[int] = []
    prefill = chat.decoder._prefill
    monkeypatch.setattr(chat.decoder, "_prefill", lambda rows: (prefills.append(len(rows)), prefill(rows))[1])
    replies = concurrently(chat, bodies, stepped)
    assert max(sizes) == len(bodies) and sizes[0] == 1  # the later requests joined the first one's batch
    assert prefills == ([1] * len(bodies) if prefill_tokens == 30 else [1, len(bodies) - 1])
    assert len({n for n, _, _ in expected}) == len(bodies)  # prompts of different lengths
    for (n_prompt, new, logprobs), reply, b in zip(expected, replies, bodies, strict=True):
        choice = reply["choices"][0]
        assert choice["token_ids"] == new and len(new) == b["max_tokens"] and len(set(new)) > 5
        assert choice["finish_reason"] == "length"
        assert reply["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(new),
                                  "total_tokens": n_prompt + len(new)}
        assert reply["prompt_token_ids"] == chat.prompt_ids(b)
        got = [c["logprob"] for c in choice["logprobs"]["content"]]
        assert got == pytest.approx(logprobs, abs=1e-4)


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(chat: ChatModel, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = [{"temperature": 1.3}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0, "top_k": 5},
                {"temperature": 0}, {"temperature": 1.5, "top_p": 0.95, "top_k": 40}]
    bodies = [body(p, seed=100 + i, max_tokens=20, **s) for i, (p, s) in enumerate(zip(PROMPTS, settings, strict=True))]
    alone = [chat.complete(b)["choices"][0]["token_ids"] for b in bodies]
    sizes, stepped = batch_sizes(chat, monkeypatch, waiting=len(bodies) - 1)
    batched = [r["choices"][0]["token_ids"] for r in concurrently(chat, bodies, stepped)]
    assert max(sizes) == len(bodies)
    assert batched == alone
    reseeded = chat.complete({**bodies[0], "seed": 7})["choices"][0]["token_ids"]
    assert reseeded != alone[0]  # the seed, not the batch, decides the draws
    top1 = chat.complete({**bodies[2], "top_k": 1})["choices"][0]["token_ids"]
    assert top1 == chat.complete({**bodies[2], "temperature": 0})["choices"][0]["token_ids"]  # top-k is the row's


def test_each_row_ends_on_its_own_cap_and_stop_string(chat: ChatModel, monkeypatch: pytest.MonkeyPatch) -> None:
    greedy = chat.complete(body(PROMPTS[0], temperature=0, max_tokens=30))
    text, ids = greedy["choices"][0]["message"]["content"], greedy["choices"][0]["token_ids"]
    # A stop string that the greedy reply reaches at its 6th token at the latest
    with chat.tokenizer_lock:
        stop = next(s for k in range(2, 7) if (s := chat.tokenizer.decode(ids[k - 2:k]).strip()))
    bodies = [body(PROMPTS[2], temperature=0, max_tokens=25), body(PROMPTS[0], temperature=0, max_tokens=30,
                                                                    stop=[stop]),
              body(PROMPTS[1], temperature=0, max_tokens=3)]
    _, stepped = batch_sizes(chat, monkeypatch)
    long, stopped, capped = concurrently(chat, bodies, stepped)
    cut = stopped["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == text[: text.index(stop)]
    assert cut["token_ids"] == ids[: len(cut["token_ids"])] and len(cut["token_ids"]) < 30
    assert capped["choices"][0]["finish_reason"] == "length" and capped["usage"]["completion_tokens"] == 3
    assert long["usage"]["completion_tokens"] == 25


def test_a_late_stop_string_ends_the_row_from_the_replys_tail(chat: ChatModel,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop string reached late in a reply ends it as decoding the whole reply would, though each step decodes only
    the reply's tail (a whole decode per step costs quadratic time in the reply's length)."""
    greedy = chat.complete(body(PROMPTS[0], temperature=0, max_tokens=40))
    text, ids = greedy["choices"][0]["message"]["content"], greedy["choices"][0]["token_ids"]
    with chat.tokenizer_lock:  # the first 2-token piece after the 25th token that is new text there
        stop = next(s for k in range(25, 40) if (s := chat.tokenizer.decode(ids[k - 2:k]).strip())
                    and s not in chat.tokenizer.decode(ids[:k - 2]))
    decoded: list[int] = []
    decode = chat.decoder.decode
    monkeypatch.setattr(chat.decoder, "decode", lambda new: decoded.append(len(new)) or decode(new))
    cut = chat.complete(body(PROMPTS[0], temperature=0, max_tokens=40, stop=[stop]))["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == text[: text.index(stop)]
    assert len(cut["token_ids"]) >= 24 and cut["token_ids"] == ids[: len(cut["token_ids"])]
    assert decoded and max(decoded) <= 4 * len(stop) + 4 < len(cut["token_ids"])


def test_the_server_gets_its_batch_from_the_config(tmp_path: Path) -> None:
    cfg = GymforgeConfig.model_validate({"evaluate": {"serving": {"max_batch": 5}}})
    cmd = transformers_command(cfg.evaluate.serving, "ckpt", "name", tmp_path)
    assert cmd[cmd.index("--max-batch") + 1] == "5"
    with pytest.raises(ValueError, match="max_batch"):
        BatchDecoder(None, device="cpu", pad_id=0, eos_ids=[0], max_batch=0, decode=str)


@pytest.mark.slow
def test_concurrent_http_requests_get_their_alone_replies(checkpoint: Path) -> None:
    serving = GymforgeConfig.model_validate({"evaluate": {"serving": {
        "backend": "transformers", "max_new_tokens": 16, "max_batch": 4, "startup_timeout_s": 180}}}).evaluate.serving
    with serve_checkpoint(serving, str(checkpoint), "tiny-batch") as endpoint:
        client = endpoint.openai_client(max_retries=0, timeout=60)

        def ask(prompt: str) -> Callable[[], list[int]]:
            def send() -> list[int]:
                reply = client.chat.completions.create(model="tiny-batch", messages=[{"role": "user", "content": prompt}],
                                                       temperature=0, extra_body={"return_token_ids": True})
                return reply.choices[0].model_extra["token_ids"]
            return send

        alone = [ask(p)() for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: ask(p)(), PROMPTS))
    assert together == alone and all(len(ids) == 16 for ids in alone)
