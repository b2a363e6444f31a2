"""Greedy generation with a submitted model directory: the task's own code, never the agent's.

`generate(model_dir, prompts, max_new_tokens)` loads `model_dir` (a Hugging Face folder) with safetensors weights
only and `trust_remote_code=False`, renders each prompt with the tokenizer's chat template (one user turn) and
returns the greedy continuations, decoded without special tokens. Under gymforge it runs in a sandbox of its own with
the submitted folder and no answers (`gymforge_eval.import_submission`); `python generate.py [MODEL_DIR]` answers the
first practice prompts of data/train.jsonl.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

BATCH = 16


def generate(model_dir, prompts, max_new_tokens=8):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("GYMFORGE_TORCH_THREADS", "2")))
    options = {"trust_remote_code": False, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(model_dir, **options)
    # The job's GPU when it has one (a Qwen3-4B base declares evaluate.task_gpus), else the CPU; fp32 on both, so a
    # GPU scores without bf16 rounding.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True, dtype=torch.float32, **options)
    model.to(device).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": str(p)}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), BATCH):
            batch = tokenizer(texts[i:i + BATCH], return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            ids = model.generate(**batch, do_sample=False, max_new_tokens=int(max_new_tokens),
                                 pad_token_id=tokenizer.pad_token_id)
            new = ids[:, batch["input_ids"].shape[1]:]
            out += [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
    return out


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "data", "train.jsonl")) as f:
        rows = [json.loads(line) for line in f][:5]
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "final_model")
    for row, reply in zip(rows, generate(model_dir, [r["prompt"] for r in rows])):
        print(f"{reply!r} (expected {row['answer']!r})")
