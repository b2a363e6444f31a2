"""The model-serving seam: every model reaches the agent as an OpenAI-compatible endpoint.

`open_endpoint(cfg, spec, checkpoint=..., served_name=...)` is a context manager yielding an `Endpoint`
(base URL, model name to send, API key):

- `teacher`: `llm.teacher` (the offline teacher's loopback server is started or reused in-process);
  `spec.model` overrides the model name;
- `endpoint`: an external endpoint (`spec.base_url`, `spec.model`, key from `spec.api_key_env`);
- `student-base`, `student-sft`, `checkpoint`: `checkpoint` (a folder or a hub id) is served for the
  duration of the block by `evaluate.serving`:
  - `transformers`: this module's own loopback server (`python -m gymforge.llm.serving`) in a subprocess,
    wrapping `AutoModelForCausalLM` and the checkpoint's chat template;
  - `vllm`: `vllm serve <checkpoint> --served-model-name N --port P --tensor-parallel-size G [vllm_args]`;
  - `auto`: vllm when `serving.gpus > 0` and vllm is installed, else transformers.
  The subprocess is started in its own process group, health-polled on `/v1/models` until
  `serving.startup_timeout_s`, and killed (group and all) when the block ends, on exceptions too. Should
  this process die without cleaning up (SIGKILL, a scheduler's SIGTERM), the server notices within seconds
  that its parent is gone and exits: the transformers server watches it itself, vLLM runs under a small
  supervisor (`python -m gymforge.llm.serving --supervise`) that does. Its output goes to
  `<caller log>.server.log` when a log path is given, else to a temporary file whose tail is shown when it
  fails to start. That file and the port file share one temporary folder, removed by the caller, or by the
  server (or its supervisor) when it outlived its caller.

The transformers server (`GET /v1/models`, `POST /v1/chat/completions`; `stream: true` answers one SSE chunk):

- concurrent requests are decoded together (continuous batching, `serving.max_batch` rows at most, `--max-batch`):
  each HTTP thread hands its request to one worker thread, which prefills the waiting prompts (left-padded to
  one length, in groups of at most 8,192 padded tokens: a padded prefill's mask grows with the square), merges their KV cache into the running batch's (padding the shorter on the left, masked) and
  samples one token a step for every row, each under its own temperature, top-k, top-p and random generator;
  requests that arrive join between steps, and a row that ends (eos, stop string, token cap) leaves the batch
  and is answered at once. Under greedy decoding a batched reply has the same token ids as the same request
  alone (`tests/llm/test_batching.py`, float32 on the CPU); a seeded request draws from its own
  `torch.Generator`, so its reply does not depend on what else is in the batch. Both hold up to floating-point
  rounding: kernels of another batch shape may round differently (more so in bf16 on a GPU), which can flip a
  near-tie between two tokens, as in any batching server. transformers' own continuous batching
  (`generate_batch`) is not used: it samples with one generator for the whole batch (no per-request seed), takes
  greedy-or-sampling for the whole manager, and has no stop strings. A model whose KV cache is not plain
  per-layer tensors (sliding-window layers) is batched only between batches: later requests wait for the running
  batch to end. `/v1/models` and `/health` answer while requests are generating (a ThreadingHTTPServer). The
  server sets `OMP_WAIT_POLICY=PASSIVE` unless it is set: on a busy CPU, spinning OpenMP threads starved the
  decoding thread;
- `max_tokens` (or `max_completion_tokens`) is capped at `serving.max_new_tokens` and at what is left of
  the model's context window; `temperature` 0 is greedy (the request's temperature, else
  `serving.temperature`); `top_p`/`top_k` are honoured and, when unset, come from the checkpoint's
  generation config (as vLLM does); `seed` (when given) makes sampling reproducible, alone or in a batch;
- generation stops at the tokenizer's eos, `<|im_end|>`, the generation config's eos ids and the
  request's `stop` strings; `finish_reason` is `stop` for those and `length` when the token cap ended it;
- `usage` counts prompt tokens (chat template applied, generation prompt included) and generated tokens
  (the end-of-turn token included, as vLLM counts);
- a prompt that leaves no room for a single new token in the model's context
  (`max_position_embeddings`) is answered with HTTP 400 `invalid_request_error` naming both numbers, as
  vLLM does, not silently truncated: an agent history that no longer fits is the caller's to shorten;
- the `model` of a request must be the served name (404 otherwise, as vLLM does);
- `tools` are passed to the chat template, but replies are plain text (no `tool_calls` parsing): the agent
  acts through text commands;
- tokens, in vLLM's shape, so one client reads both backends: `return_token_ids: true` adds the prompt's ids
  (`prompt_token_ids`, the chat template applied) to the response and the reply's ids (`token_ids`, every sampled
  token: the end-of-turn token included, and all of them when a `stop` string cut the text) to the choice;
  `logprobs: true` adds OpenAI's `choices[0].logprobs.content[*].logprob`, each sampled token's log-prob under the
  distribution it was drawn from (after temperature, top-k and top-p; `top_logprobs` is always empty). vLLM is
  launched with `--logprobs-mode processed_logprobs` to return the same (its default is the raw model's).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from gymforge.core import atomic, plugins
from gymforge.core.plan import SERVED_SOURCES
from gymforge.core.config import EndpointConfig, GymforgeConfig, ModelSpec, ServingConfig
from gymforge.llm.batching import BatchDecoder, Row
from gymforge.llm.http import BadRequest, ChatCompletionsHandler, LoopbackHTTPServer

log = logging.getLogger("gymforge.llm.serving")

LOCAL_KEY = "local"


class ServingError(RuntimeError):
    """A model could not be served; the message says why and what to change."""


@dataclass(frozen=True)
class Endpoint:
    """Where the agent sends its chat requests for one model."""

    base_url: str  # ends in /v1
    model: str  # the `model` field to send
    provider: str  # offline (the embedded teacher), openai (external), transformers or vllm (served here)
    api_key_env: str | None = None  # environment variable holding the key; None: a literal key (`api_key_literal`)
    api_key_literal: str = LOCAL_KEY
    pid: int | None = None  # the serving subprocess, when this module started one
    backend: str | None = None  # transformers / vllm for served checkpoints

    def api_key(self) -> str:
        if self.api_key_env is None:
            return self.api_key_literal
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ServingError(f"environment variable {self.api_key_env} (the API key of {self.model}) is not set")
        return key

    def client_config(self, base: EndpointConfig | None = None, **overrides: Any) -> EndpointConfig:
        """An `EndpointConfig` for `LLMClient(..., base_url=endpoint.base_url)`; sampling settings from `base`.

        Served and offline models need no key: they get provider `offline`, whose key is a fixed literal. Checkpoints
        served here are asked for their token ids and log-probs (`token_ids`; the trajectories keep them)."""
        base = base or EndpointConfig()
        fields: dict[str, Any] = {"model": self.model, "base_url": self.base_url}
        if self.backend in ("transformers", "vllm"):
            fields["token_ids"] = True
        if self.api_key_env is None:
            fields["provider"] = "offline"
        else:
            fields.update(provider="openai", api_key_env=self.api_key_env)
        return base.model_copy(update={**fields, **overrides})

    def openai_client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key(), **kwargs)


# ---- choosing and launching a backend --------------------------------------------------------------


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_backend(serving: ServingConfig) -> str:
    """`transformers` or `vllm` for a served checkpoint; a clear error when vllm is asked for but missing."""
    if serving.backend == "vllm":
        if not vllm_installed():
            raise ServingError(
                "evaluate.serving.backend is 'vllm' but vllm is not installed in this environment "
                f"({sys.executable}): `pip install vllm` on a CUDA GPU machine, or set evaluate.serving.backend "
                "to 'transformers' (or 'auto')")
        return "vllm"
    if serving.backend == "auto":
        if serving.gpus > 0 and vllm_installed():
            return "vllm"
        if serving.gpus > 0:
            log.warning("evaluate.serving.backend auto: vllm is not installed, serving with transformers")
        return "transformers"
    return "transformers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def vllm_command(serving: ServingConfig, checkpoint: str, served_name: str, port: int,
                 host: str = "127.0.0.1") -> list[str]:
    # --logprobs-mode processed_logprobs: a reply's log-probs are those of the distribution its tokens were drawn from
    # (after temperature, top-k, top-p), the behaviour policy of the RL update; vLLM's default is the raw model's.
    return [_script("vllm"), "serve", str(checkpoint), "--served-model-name", served_name, "--host", host,
            "--port", str(port), "--tensor-parallel-size", str(max(1, serving.gpus)),
            "--logprobs-mode", "processed_logprobs", *serving.vllm_args]


def transformers_command(serving: ServingConfig, checkpoint: str, served_name: str, scratch: Path,
                         host: str = "127.0.0.1") -> list[str]:
    """The loopback server's command; it writes its port to `scratch`/port and removes `scratch` should this process
    die without doing so."""
    return [sys.executable, "-m", "gymforge.llm.serving", "--checkpoint", str(checkpoint), "--served-name", served_name,
            "--host", host, "--port", "0", "--port-file", str(scratch / "port"),
            "--max-new-tokens", str(serving.max_new_tokens), "--temperature", str(serving.temperature),
            "--max-batch", str(serving.max_batch), "--parent-pid", str(os.getpid()), "--scratch", str(scratch)]


def _server_log(log_path: str | Path | None, scratch: Path) -> Path:
    """The file the server writes to: beside `log_path`, else in the server's temporary folder `scratch`."""
    if log_path is None:
        return scratch / "server.log"
    path = Path(log_path)
    path = path.with_name(path.stem + ".server.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


def _models(base_url: str, timeout: float = 5.0) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            return [m.get("id") for m in json.loads(resp.read()).get("data", [])]
    except (OSError, ValueError):
        return None


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate the process group of `proc` (SIGTERM, then SIGKILL after `grace_s`) and reap it."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # children that outlived their leader
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def serve_checkpoint(serving: ServingConfig, checkpoint: str, served_name: str, *,
                     log_path: str | Path | None = None) -> Iterator[Endpoint]:
    """Serve `checkpoint` in a subprocess for the duration of the block."""
    backend = choose_backend(serving)
    # The port file and a temporary log live in one folder, which the server removes itself should this process
    # die without cleaning up (SIGKILL): a killed caller leaves nothing in the temporary directory.
    scratch = Path(tempfile.mkdtemp(prefix="gymforge-serve-"))
    out_path, port_file = _server_log(log_path, scratch), scratch / "port"
    port = None
    if backend == "vllm":
        port = free_port()
        # Under a supervisor that ends vLLM (and its engine processes) if this process dies without cleaning up.
        cmd = [sys.executable, "-m", "gymforge.llm.serving", "--supervise", "--parent-pid", str(os.getpid()),
               "--scratch", str(scratch), "--", *vllm_command(serving, checkpoint, served_name, port)]
    else:
        cmd = transformers_command(serving, checkpoint, served_name, scratch)
    log.info("serving %s as %r with %s (log: %s)", checkpoint, served_name, backend, out_path)
    with out_path.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        base_url = _wait_ready(proc, backend, port, port_file, served_name, serving.startup_timeout_s, out_path)
        log.info("%s ready at %s (pid %d)", served_name, base_url, proc.pid)
        yield Endpoint(base_url=base_url, model=served_name, provider=backend, api_key_env=None,
                       api_key_literal=LOCAL_KEY, pid=proc.pid, backend=backend)
    finally:
        stop_process(proc)
        shutil.rmtree(scratch, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen, backend: str, port: int | None, port_file: Path, served_name: str,
                timeout_s: float, out_path: Path) -> str:
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        code = proc.poll()
        if code is not None:
            raise ServingError(f"the {backend} server for {served_name!r} exited with code {code} before it was "
                               f"ready; last lines of {out_path}:\n{_tail(out_path)}")
        if port is None and port_file.exists():
            text = port_file.read_text().strip()
            port = int(text) if text else None
        if port is not None:
            base_url = f"http://127.0.0.1:{port}/v1"
            models = _models(base_url, timeout=5.0)
            if models is not None and served_name in models:
                return base_url
        if time.monotonic() > deadline:
            stop_process(proc)
            raise ServingError(f"the {backend} server for {served_name!r} was not ready after {timeout_s:.0f}s "
                               f"(evaluate.serving.startup_timeout_s); last lines of {out_path}:\n{_tail(out_path)}")
        time.sleep(delay)
        delay = min(1.0, delay * 1.5)


@contextlib.contextmanager
def open_endpoint(cfg: GymforgeConfig, spec: ModelSpec, *, checkpoint: str | None, served_name: str,
                  log: str | Path | None = None) -> Iterator[Endpoint]:
    """The endpoint of one model to score, live for the duration of the block (see the module docstring).

    `checkpoint`: the folder or hub id to serve for student-base/student-sft (required) and checkpoint
    (default: `spec.model`); ignored for teacher/endpoint. `served_name`: the model name a served checkpoint
    answers to. Served models are answered from a fresh process: the agent's response cache keys on the model
    name, so a name that changes with the checkpoint (e.g. with its digest) keeps stale answers out.
    """
    if spec.source == "teacher":
        teacher = cfg.llm.teacher
        model = spec.model or teacher.model
        if teacher.provider == "offline":
            yield Endpoint(base_url=plugins.load("offline-teacher")(teacher.offline_endpoint), model=model, provider="offline", api_key_env=None,
                           api_key_literal="offline")
        else:
            base_url = teacher.base_url or os.environ.get("OPENAI_BASE_URL")
            if not base_url:
                raise ServingError("llm.teacher.base_url is not set (nor OPENAI_BASE_URL)")
            yield Endpoint(base_url=base_url, model=model, provider="openai", api_key_env=teacher.api_key_env)
        return
    if spec.source == "endpoint":
        assert spec.base_url and spec.model  # ModelSpec validates this
        yield Endpoint(base_url=spec.base_url, model=spec.model, provider="openai", api_key_env=spec.api_key_env)
        return
    if spec.source not in SERVED_SOURCES:
        raise ServingError(f"model {spec.name}: unknown source {spec.source!r}")
    target = checkpoint if checkpoint is not None else (spec.model if spec.source == "checkpoint" else None)
    if not target:
        raise ServingError(f"model {spec.name} ({spec.source}): no checkpoint to serve")
    with serve_checkpoint(cfg.evaluate.serving, str(target), served_name, log_path=log) as endpoint:
        yield endpoint


# ---- the transformers server (runs in the subprocess) ----------------------------------------------


def _text(content: Any) -> str:
    """A message's content as text (OpenAI allows a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


class ChatModel:
    """A causal LM with its tokenizer and chat template; `complete(body)` is one chat completion.

    Requests are decoded together by one worker thread (`max_batch` rows at most; see the module docstring)."""

    def __init__(self, checkpoint: str, served_name: str, *, max_new_tokens: int = 1024,
                 default_temperature: float = 0.7, device: str | None = None, dtype: str = "auto",
                 max_batch: int = 32) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.served_name = served_name
        self.max_new_tokens = max_new_tokens
        self.default_temperature = default_temperature
        self.max_batch = max_batch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        if not self.tokenizer.chat_template:
            raise ServingError(f"{checkpoint}: the tokenizer has no chat template")
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, device_map=self.device)
        self.model.eval()
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 32768)
        eos: set[int] = set()
        gen_eos = self.model.generation_config.eos_token_id
        eos.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id and im_end >= 0:
            eos.add(im_end)
        self.eos_ids = sorted(eos)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        # Only what the checkpoint's generation_config.json sets explicitly (vLLM reads the same).
        self.sampling_defaults = {k: v for k, v in self.model.generation_config.to_diff_dict().items()
                                  if k in ("top_p", "top_k") and v is not None}
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between threads
        self.decoder = BatchDecoder(self.model, device=self.device, pad_id=self.pad_id, eos_ids=self.eos_ids,
                                    max_batch=max_batch, decode=self.decode)

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "`messages` must be a non-empty list")
        chat = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in messages]
        kwargs: dict[str, Any] = {}
        if body.get("tools"):
            kwargs["tools"] = body["tools"]
        with self.tokenizer_lock:
            ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False, **kwargs)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        model_name = body.get("model")
        if model_name and model_name != self.served_name:
            raise BadRequest(404, f"The model `{model_name}` does not exist (this server serves "
                             f"`{self.served_name}`).", "not_found_error")
        if int(body.get("n") or 1) != 1:
            raise BadRequest(400, "only n=1 is supported")
        row = self._row(body)
        self.decoder.run(row)
        return self._reply(body, row)

    def decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _row(self, body: dict[str, Any]) -> Row:
        ids = self.prompt_ids(body)
        room = self.context - len(ids)
        if room < 1:
            raise BadRequest(400, f"This model's maximum context length is {self.context} tokens. However, your "
                             f"messages resulted in {len(ids)} tokens; shorten the conversation.")
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        limit = min(int(asked) if asked else self.max_new_tokens, self.max_new_tokens, room)
        if limit < 1:
            raise BadRequest(400, "max_tokens must be at least 1")
        temperature = body.get("temperature")
        temperature = self.default_temperature if temperature is None else float(temperature)
        # Unset sampling knobs default to the checkpoint's generation config, as vLLM does.
        gen = self.sampling_defaults
        top_p = body.get("top_p") if body.get("top_p") is not None else gen.get("top_p", 1.0)
        top_k = body.get("top_k") if body.get("top_k") is not None else gen.get("top_k")
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        seed = body.get("seed")
        return Row(ids=ids, limit=limit, temperature=temperature, top_p=float(top_p),
                    top_k=int(top_k) if top_k and int(top_k) > 0 else 0, stops=stops,
                    seed=None if seed is None else int(seed))

    def _reply(self, body: dict[str, Any], row: Row) -> dict[str, Any]:
        ids, new = row.ids, row.new
        finish = "stop" if new and new[-1] in self.eos_ids else "length"
        with self.tokenizer_lock:
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            tokens = self.tokenizer.convert_ids_to_tokens(new) if body.get("logprobs") else []
        for s in row.stops:
            if s in text:
                text, finish = text[: text.index(s)], "stop"
        logprobs = None
        if body.get("logprobs"):  # each sampled token's log-prob under the distribution it was drawn from
            logprobs = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                                    for t, lp in zip(tokens, row.logprobs, strict=True)]}
        prompt_tokens, completion_tokens = len(ids), len(new)
        return {
            "id": f"chatcmpl-{os.getpid()}-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                         "logprobs": logprobs,
                         **({"token_ids": new} if body.get("return_token_ids") else {})}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            **({"prompt_token_ids": ids} if body.get("return_token_ids") else {}),
        }

class _Handler(ChatCompletionsHandler):
    server_version = "gymforge-transformers-server"
    chat: ChatModel

    def models(self) -> list[dict[str, Any]]:
        return [{"id": self.chat.served_name, "object": "model", "created": 0, "owned_by": "gymforge",
                 "max_model_len": self.chat.context}]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.chat.complete(body)


def make_server(chat: ChatModel, host: str = "127.0.0.1", port: int = 0) -> LoopbackHTTPServer:
    return LoopbackHTTPServer((host, port), type("Handler", (_Handler,), {"chat": chat}))


def _watch_parent(parent_pid: int, server: LoopbackHTTPServer) -> None:
    """Stop serving when the process that started us is gone (no orphaned servers after a hard kill)."""
    while True:
        time.sleep(2.0)
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone; shutting down", parent_pid)
            server.shutdown()
            return


def supervise(parent_pid: int, cmd: Sequence[str], scratch: str | None = None) -> int:
    """Run `cmd`; end it when `parent_pid` is gone or when told to stop (SIGTERM/SIGINT); return its exit code.
    `scratch`: the caller's temporary folder for this server, removed if the caller is gone."""
    child = subprocess.Popen(list(cmd))
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    while child.poll() is None:
        if stopping.wait(1.0) or os.getppid() != parent_pid:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            break
    code = child.wait()
    _remove_if_orphaned(parent_pid, scratch)
    return code


def _remove_if_orphaned(parent_pid: int | None, scratch: str | None) -> None:
    """The caller cleans up its server's temporary folder; when it died first (SIGKILL), the server does."""
    if parent_pid and scratch and os.getppid() != parent_pid:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m gymforge.llm.serving --checkpoint C --served-name N [--port 0] [--port-file F] ...`

    (`python -m gymforge.llm.serving --supervise --parent-pid P [--scratch DIR] -- CMD...` runs CMD as `supervise`
    does.)"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--supervise"]:
        sep = argv.index("--")
        scratch = argv[argv.index("--scratch") + 1] if "--scratch" in argv[:sep] else None
        sys.exit(supervise(int(argv[argv.index("--parent-pid") + 1]), argv[sep + 1:], scratch))
    p = argparse.ArgumentParser(prog="python -m gymforge.llm.serving",
                                description="Serve a transformers checkpoint as an OpenAI-compatible endpoint.")
    p.add_argument("--checkpoint", required=True, help="model folder or hub id")
    p.add_argument("--served-name", required=True, help="the model name requests must use")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed and written to --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here (atomically) once listening")
    p.add_argument("--max-new-tokens", type=int, default=ServingConfig().max_new_tokens)
    p.add_argument("--temperature", type=float, default=ServingConfig().temperature,
                   help="temperature of requests that send none")
    p.add_argument("--max-batch", type=int, default=ServingConfig().max_batch,
                   help="requests decoded together at most (1: one at a time)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    p.add_argument("--scratch", default=None, help="the caller's temporary folder for this server (port file, "
                   "temporary log): removed on exit if the --parent-pid process is gone")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. The decoding loop runs many small
    # parallel ops from one long-lived thread; on a CPU shared with sandboxes and agents, spinning team threads
    # took the cores it needed (a lone 16-token reply of the tiny student: 1.3 s spinning, 0.05 s passive, on 2
    # oversubscribed cores).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    chat = ChatModel(args.checkpoint, args.served_name, max_new_tokens=args.max_new_tokens,
                     default_temperature=args.temperature, device=args.device, dtype=args.dtype,
                     max_batch=args.max_batch)
    server = make_server(chat, args.host, args.port)
    port = server.server_address[1]
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, server), daemon=True).start()
    if args.port_file:
        atomic.write_text(args.port_file, f"{port}\n")
    print(f"serving {args.checkpoint} as {args.served_name!r} on http://{args.host}:{port}/v1 "
          f"(device {chat.device}, context {chat.context}, batches of {chat.max_batch} at most)", flush=True)
    server.serve_until_interrupted()
    _remove_if_orphaned(args.parent_pid, args.scratch)


if __name__ == "__main__":
    main()
