"""Whether a submitted model descends from the post-training task's base (`gymforge.tasks.posttraining`): the same
config fields that define the architecture (none that loads code), the same `tokenizer.json`, the same tensor names,
shapes and float dtypes (read with the `safetensors` library, never unpickled), and weights that moved from the base
as a fine-tune's do (`measure_drift`), not as a foreign or re-initialised checkpoint's (`check_descent`)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.agent.errors import EvaluationFormatError

ARTEFACT = "final_model"

# The config fields that do not define the network: they may differ between the base and a fine-tuned save.
CONFIG_FREE = frozenset({
    "dtype", "torch_dtype", "transformers_version", "_name_or_path", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "output_attentions", "output_hidden_states", "return_dict", "tie_word_embeddings_warning",
})
# Config fields that make `from_pretrained` run or fetch code, or change how weights are read: never accepted.
CONFIG_REFUSED = ("auto_map", "quantization_config", "custom_pipelines")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
TOKENIZER_DEFINING = "tokenizer.json"  # vocabulary, merges, special tokens: the token ids themselves
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})
INDEX = "model.safetensors.index.json"  # a sharded model's tensor -> file map

# Weight drift (relative L2 distance from the base, per tensor): a tensor is "far" past FAR_TENSOR; a model whose
# share of far tensors exceeds MAX_FAR_SHARE, or whose whole-model drift exceeds MAX_TOTAL_DRIFT, is not a
# fine-tune of the base. Measured (docs/post-training.md): the reference SFT moves SmolLM2-135M's tensors by at most
# 0.022 (0.0037 overall); a re-initialised SmolLM2 has 271 of 272 tensors past 0.5 and is 1.01 away overall.
FAR_TENSOR = 0.5
MAX_FAR_SHARE = 0.25
MAX_TOTAL_DRIFT = 0.5

MAX_MODEL_FILE = 64 << 20  # config/tokenizer files read as data


class ModelRejected(EvaluationFormatError):
    """The submitted model is not a post-trained descendant of the task's base; the message says why."""


@dataclass
class Descent:
    """What `check_descent` found; `reasons` empty: the model descends from the base."""

    reasons: list[str] = field(default_factory=list)
    tensors: int = 0
    far: int = 0
    max_drift: float = 0.0
    total_drift: float = 0.0
    drifts: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def raise_if_rejected(self) -> None:
        if self.reasons:
            raise ModelRejected(f"{ARTEFACT}/ was rejected: " + "; ".join(self.reasons))


def _json(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_MODEL_FILE:
        return None
    try:
        data = json.loads(path.read_bytes())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _sha256(path: Path) -> str | None:
    if not path.is_file() or path.is_symlink():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_differences(base: Mapping[str, Any], submitted: Mapping[str, Any]) -> list[str]:
    """The architecture-defining config fields where `submitted` differs from `base`, and refused fields."""
    out = [f"config.json sets {key!r}, which loads code or changes how weights are read" for key in CONFIG_REFUSED
           if key in submitted]
    for key in sorted(set(base) | set(submitted)):
        if key in CONFIG_FREE or key in CONFIG_REFUSED:
            continue
        if base.get(key) != submitted.get(key):
            out.append(f"config.json {key} is {submitted.get(key)!r}, the base's is {base.get(key)!r}")
    return out


def _headers(folder: Path) -> dict[str, tuple[str, list[int], str]] | str:
    """name -> (dtype, shape, file) of every tensor in the folder's *.safetensors, or why they cannot be read."""
    from safetensors import safe_open

    files = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
    if not files:
        return "no *.safetensors weights (save with safe_serialization; pickled .bin/.pt weights are never loaded)"
    out: dict[str, tuple[str, list[int], str]] = {}
    for path in files:
        if path.is_symlink() or not path.is_file():
            return f"{path.name} is not a regular file"
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if name in out:
                        return f"tensor {name} is in two files"
                    sl = f.get_slice(name)
                    out[name] = (str(sl.get_dtype()), list(sl.get_shape()), path.name)
        except Exception as err:  # noqa: BLE001 - a hostile file: any parse error is a rejection
            return f"{path.name} is not a readable safetensors file ({type(err).__name__})"
    return out


def check_descent(base: Path, model: Path, *, drift: bool = True) -> Descent:
    """Whether the folder `model` is a fine-tune of the folder `base`. Config and tokenizer files are read as data,
    weights with the safetensors library; nothing is unpickled, nothing of the model's runs."""
    found = Descent()
    base_cfg, cfg = _json(base, "config.json"), _json(model, "config.json")
    if cfg is None:
        found.reasons.append("no readable config.json")
    elif base_cfg is not None:
        found.reasons += config_differences(base_cfg, cfg)
    if _sha256(model / TOKENIZER_DEFINING) != _sha256(base / TOKENIZER_DEFINING):
        found.reasons.append(f"{TOKENIZER_DEFINING} is missing or differs from the base's (the tokenizer must be "
                             "the base's)")
    base_heads, heads = _headers(base), _headers(model)
    if isinstance(heads, str):
        found.reasons.append(heads)
        return found
    if isinstance(base_heads, str):
        raise RuntimeError(f"the base model {base}: {base_heads}")
    missing, extra = sorted(set(base_heads) - set(heads)), sorted(set(heads) - set(base_heads))
    if missing or extra:
        found.reasons.append(f"tensor names differ from the base's (missing {missing[:3]}, extra {extra[:3]})")
    shapes = [n for n in sorted(set(heads) & set(base_heads)) if heads[n][1] != base_heads[n][1]]
    if shapes:
        found.reasons.append(f"tensor shapes differ from the base's ({shapes[0]}: {heads[shapes[0]][1]} against "
                             f"{base_heads[shapes[0]][1]})")
    dtypes = sorted({heads[n][0] for n in heads} - FLOAT_DTYPES)
    if dtypes:
        found.reasons.append(f"weights of dtype {dtypes} (only {sorted(FLOAT_DTYPES)})")
    if (model / INDEX).exists():
        index = _json(model, INDEX)
        weight_map = index.get("weight_map") if index is not None else None
        if weight_map != {name: head[2] for name, head in heads.items()}:
            found.reasons.append(f"{INDEX} does not map each tensor to the file that holds it")
    if found.reasons or not drift:
        return found
    measure_drift(base, model, base_heads, heads, found)
    if found.far > MAX_FAR_SHARE * found.tensors or found.total_drift > MAX_TOTAL_DRIFT:
        found.reasons.append(
            f"not a fine-tune of the base: {found.far} of {found.tensors} tensors moved more than {FAR_TENSOR:g} "
            f"(relative L2) from the base's weights, the whole model {found.total_drift:.3g} (a foreign or "
            f"re-initialised checkpoint; limits: {MAX_FAR_SHARE:.0%} of tensors, {MAX_TOTAL_DRIFT:g} overall)")
    return found


def measure_drift(base: Path, model: Path, base_heads: Mapping[str, tuple[str, list[int], str]],
                  heads: Mapping[str, tuple[str, list[int], str]], found: Descent) -> None:
    """Relative L2 distance ||W - B|| / ||B|| of every tensor, and of the whole model, into `found`."""
    import torch
    from safetensors import safe_open

    diff_sq = base_sq = 0.0
    handles: dict[tuple[Path, str], Any] = {}
    try:
        def tensor(folder: Path, file: str, name: str) -> Any:
            key = (folder, file)
            if key not in handles:
                handles[key] = safe_open(str(folder / file), framework="pt").__enter__()
            return handles[key].get_tensor(name).to(torch.float32)

        for name in sorted(base_heads):
            b = tensor(base, base_heads[name][2], name)
            w = tensor(model, heads[name][2], name)
            d = float(torch.linalg.vector_norm(w - b)) ** 2
            n = float(torch.linalg.vector_norm(b)) ** 2
            if not math.isfinite(d):
                d = math.inf
            rel = math.sqrt(d / n) if n > 0 else (0.0 if d == 0 else math.inf)
            found.drifts[name] = rel
            found.far += rel > FAR_TENSOR
            diff_sq += d
            base_sq += n
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    found.tensors = len(base_heads)
    found.max_drift = max(found.drifts.values(), default=0.0)
    found.total_drift = math.sqrt(diff_sq / base_sq) if base_sq > 0 else 0.0
