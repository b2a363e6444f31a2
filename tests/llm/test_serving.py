"""The serving seam: endpoints for every model source, the transformers server subprocess (through the real
`openai` client and the agent's `LLMClient`), and the vLLM command line and backend choice (vLLM itself cannot
run here: no GPU)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest

from gymforge.llm import serving
from gymforge.student import base as student
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.llm.serving import Endpoint, ServingError, choose_backend, open_endpoint, vllm_command
from gymforge.student.tokenizer import train_offline_tokenizer

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}
CONTEXT = 96  # the served fixture's context window, small enough to overflow in a test
MAX_NEW = 12


def make_cfg(**serving_cfg: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({"train": {"tiny": TINY}, "evaluate": {"serving": serving_cfg}})


def served_cfg(**extra: Any) -> GymforgeConfig:
    return make_cfg(backend="transformers", max_new_tokens=MAX_NEW, startup_timeout_s=180, **extra)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen3 that never ends its turn: the eos embedding (tied to the output row) is zero, so its
    logit is 0 while the largest of the others is positive; greedy replies always run to the token cap."""
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("serve")
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", "ls -la data/", "DISCUSSION"]
    train_offline_tokenizer(texts, vocab_size=320).save_pretrained(str(root / "tok"))
    cfg = make_cfg()
    student.build_base(cfg, root / "tok", root / "base")
    model = AutoModelForCausalLM.from_pretrained(str(root / "base"))
    with torch.no_grad():
        model.get_input_embeddings().weight[model.config.eos_token_id].zero_()
    model.config.max_position_embeddings = CONTEXT
    model.save_pretrained(str(root / "ckpt"))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(root / "base")).save_pretrained(str(root / "ckpt"))
    return root / "ckpt"


@pytest.fixture(scope="module")
def endpoint(checkpoint: Path) -> Iterator[Endpoint]:
    with open_endpoint(served_cfg(), ModelSpec(name="tiny", source="checkpoint", model=str(checkpoint)),
                       checkpoint=None, served_name="tiny-served") as ep:
        yield ep
    assert gone(ep.pid)


@pytest.fixture
def client(endpoint: Endpoint) -> openai.OpenAI:
    return endpoint.openai_client(max_retries=0, timeout=60)


HELLO = [{"role": "user", "content": "hello world"}]


# ---- the transformers server ----------------------------------------------------------------------------


@pytest.mark.slow
def test_models_and_a_chat_completion(endpoint: Endpoint, client: openai.OpenAI, checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    assert endpoint.provider == endpoint.backend == "transformers" and endpoint.model == "tiny-served"
    assert endpoint.base_url.startswith("http://127.0.0.1:") and endpoint.base_url.endswith("/v1")
    assert [m.id for m in client.models.list().data] == ["tiny-served"]
    reply = client.chat.completions.create(model="tiny-served", messages=HELLO, temperature=0, max_tokens=5)
    choice = reply.choices[0]
    assert reply.model == "tiny-served" and isinstance(choice.message.content, str)
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 5
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    prompt = tok.apply_chat_template(HELLO, add_generation_prompt=True, return_dict=False)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.total_tokens == len(prompt) + 5


@pytest.mark.slow
def test_max_tokens_is_capped_and_greedy_is_deterministic(client: openai.OpenAI) -> None:
    big = client.chat.completions.create(model="tiny-served", messages=HELLO, temperature=0, max_tokens=1000)
    assert big.usage.completion_tokens == MAX_NEW and big.choices[0].finish_reason == "length"
    again = client.chat.completions.create(model="tiny-served", messages=HELLO, temperature=0, max_tokens=1000)
    assert again.choices[0].message.content == big.choices[0].message.content


@pytest.mark.slow
def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.chat.completions.create(model="tiny-served", messages=HELLO, temperature=1.5, seed=seed,
                                           max_tokens=MAX_NEW)
        return r.choices[0].message.content

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first or sample(9) != first  # 12 tokens from ~320 at temperature 1.5


@pytest.mark.slow
def test_bad_requests_are_clear(client: openai.OpenAI, checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="someone-else", messages=HELLO, max_tokens=2)
    too_long = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 20}]
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {CONTEXT} tokens"):
        client.chat.completions.create(model="tiny-served", messages=too_long, max_tokens=2)
    # near the end of the context, the reply is cut to what is left
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    words = next(n for n in range(1, 200) if len(tok.apply_chat_template(
        [{"role": "user", "content": "fox " * n}], add_generation_prompt=True, return_dict=False)) >= CONTEXT - 5)
    fits = [{"role": "user", "content": "fox " * words}]
    r = client.chat.completions.create(model="tiny-served", messages=fits, temperature=0, max_tokens=MAX_NEW)
    assert CONTEXT - 5 <= r.usage.prompt_tokens < CONTEXT
    assert r.usage.completion_tokens == CONTEXT - r.usage.prompt_tokens < MAX_NEW
    assert r.choices[0].finish_reason == "length"


@pytest.mark.slow
def test_the_agents_llm_client_works_unchanged(endpoint: Endpoint, tmp_path: Path) -> None:
    from gymforge.llm.client import LLMClient

    config = endpoint.client_config(make_cfg().llm.teacher, temperature=0.0, max_tokens=4)
    assert config.model == "tiny-served" and config.base_url == endpoint.base_url
    with LLMClient(config, stage="evaluate", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger",
                   budget_usd=1.0, base_url=endpoint.base_url) as llm:
        result = llm.chat(HELLO)
    assert result.completion_tokens == 4 and result.finish_reason == "length" and result.model == "tiny-served"


@pytest.mark.slow
def test_server_is_killed_when_the_block_fails_and_logs_next_to_the_callers_log(checkpoint: Path,
                                                                                tmp_path: Path) -> None:
    caller_log = tmp_path / "logs" / "eval.log"
    spec = ModelSpec(name="student-sft", source="student-sft")
    with pytest.raises(RuntimeError, match="agent crashed"):
        with open_endpoint(served_cfg(), spec, checkpoint=str(checkpoint), served_name="sft", log=caller_log) as ep:
            pid, port = ep.pid, int(ep.base_url.rsplit(":", 1)[1].split("/")[0])
            raise RuntimeError("agent crashed")
    assert gone(pid)
    with socket.socket() as s:  # nothing listens on its port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0
    server_log = tmp_path / "logs" / "eval.server.log"
    assert "serving" in server_log.read_text()


@pytest.mark.slow
def test_a_checkpoint_that_cannot_load_fails_with_the_servers_log(tmp_path: Path) -> None:
    spec = ModelSpec(name="student-base", source="student-base")
    with pytest.raises(ServingError, match="exited with code") as err:
        with open_endpoint(served_cfg(), spec, checkpoint=str(tmp_path / "missing"), served_name="x"):
            pass
    assert "missing" in str(err.value)


# ---- other sources -------------------------------------------------------------------------------------


def test_teacher_and_external_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_cfg()
    with open_endpoint(cfg, ModelSpec(name="teacher", source="teacher"), checkpoint=None, served_name="t") as ep:
        assert ep.provider == "offline" and ep.model == cfg.llm.teacher.model and ep.pid is None
        assert ep.api_key() == "offline"
        models = ep.openai_client().models.list()
        assert models.data[0].id == "gymforge-offline-teacher"
    spec = ModelSpec(name="teacher-b", source="teacher", model="other-teacher-model")
    with open_endpoint(cfg, spec, checkpoint=None, served_name="t") as ep:
        assert ep.model == "other-teacher-model"

    remote = GymforgeConfig.model_validate({"llm": {"teacher": {"provider": "openai", "base_url": "https://x/v1",
                                                                "model": "gpt-x", "api_key_env": "MY_KEY"}}})
    with open_endpoint(remote, ModelSpec(name="teacher", source="teacher"), checkpoint=None, served_name="t") as ep:
        assert (ep.base_url, ep.model, ep.api_key_env, ep.provider) == ("https://x/v1", "gpt-x", "MY_KEY", "openai")
        monkeypatch.delenv("MY_KEY", raising=False)
        with pytest.raises(ServingError, match="MY_KEY"):
            ep.api_key()
        monkeypatch.setenv("MY_KEY", "sk-test")
        assert ep.api_key() == "sk-test"
        assert ep.client_config().provider == "openai" and ep.client_config().api_key_env == "MY_KEY"

    spec = ModelSpec(name="ollama", source="endpoint", base_url="http://localhost:11434/v1", model="qwen3:4b",
                     api_key_env="OLLAMA_KEY")
    with open_endpoint(cfg, spec, checkpoint=None, served_name="ignored") as ep:
        assert (ep.base_url, ep.model, ep.api_key_env, ep.pid) == ("http://localhost:11434/v1", "qwen3:4b",
                                                                   "OLLAMA_KEY", None)


def test_a_served_source_needs_a_checkpoint() -> None:
    with pytest.raises(ServingError, match="no checkpoint"):
        with open_endpoint(served_cfg(), ModelSpec(name="s", source="student-sft"), checkpoint=None,
                           served_name="s"):
            pass


# ---- vLLM ----------------------------------------------------------------------------------------------


def test_vllm_command_line() -> None:
    cfg = make_cfg(backend="vllm", gpus=2, vllm_args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    cmd = vllm_command(cfg.evaluate.serving, "results/checkpoints/Qwen3-4B", "student-sft", 8123)
    assert Path(cmd[0]).name == "vllm" and cmd[1:3] == ["serve", "results/checkpoints/Qwen3-4B"]
    assert cmd[cmd.index("--served-model-name") + 1] == "student-sft"
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[-4:] == ["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"]
    one = vllm_command(make_cfg(backend="vllm", gpus=0).evaluate.serving, "Qwen/Qwen3-4B", "base", 1)
    assert one[one.index("--tensor-parallel-size") + 1] == "1"


def test_auto_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "vllm_installed", lambda: True)
    assert choose_backend(make_cfg(backend="auto", gpus=0).evaluate.serving) == "transformers"
    assert choose_backend(make_cfg(backend="auto", gpus=1).evaluate.serving) == "vllm"
    assert choose_backend(make_cfg(backend="transformers", gpus=4).evaluate.serving) == "transformers"
    monkeypatch.setattr(serving, "vllm_installed", lambda: False)
    assert choose_backend(make_cfg(backend="auto", gpus=4).evaluate.serving) == "transformers"


def test_vllm_requested_but_not_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(serving, "vllm_installed", lambda: False)
    started: list[Any] = []
    monkeypatch.setattr(serving.subprocess, "Popen", lambda *a, **k: started.append(a))
    cfg = make_cfg(backend="vllm", gpus=1)
    with pytest.raises(ServingError, match="vllm is not installed.*pip install vllm"):
        with open_endpoint(cfg, ModelSpec(name="s", source="student-sft"), checkpoint=str(tmp_path),
                           served_name="s"):
            pass
    assert started == []


def test_vllm_is_really_missing_here() -> None:
    """The offline environment has no vLLM: `auto` must serve with transformers."""
    if serving.vllm_installed():
        pytest.skip("vllm is installed")
    assert choose_backend(make_cfg(backend="auto", gpus=2).evaluate.serving) == "transformers"
    with pytest.raises(ServingError, match="not installed"):
        choose_backend(make_cfg(backend="vllm").evaluate.serving)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie waiting for its new parent to reap it is gone too


def test_the_supervisor_ends_its_server_when_the_caller_dies(tmp_path: Path) -> None:
    """vLLM runs under `python -m gymforge.llm.serving --supervise`: a SIGKILLed caller leaves no server behind."""
    import subprocess
    import time

    pid_file = tmp_path / "server.pid"
    server = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    caller = (f"import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', 'gymforge.llm.serving', "
              f"'--supervise', '--parent-pid', str(os.getpid()), '--scratch', {str(scratch)!r}, '--', sys.executable, "
              f"'-c', {server!r}]); print(p.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True)
    supervisor = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the supervised server never started"
        time.sleep(0.1)
    server_pid = int(pid_file.read_text())
    assert _alive(supervisor) and _alive(server_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while _alive(server_pid) or _alive(supervisor):
        assert time.monotonic() < deadline, "the server outlived its caller"
        time.sleep(0.2)
    assert not scratch.exists(), "the supervisor left the caller's temporary folder behind"


@pytest.mark.slow
def test_the_transformers_server_exits_when_its_caller_is_killed(checkpoint: Path, tmp_path: Path) -> None:
    import subprocess
    import time

    caller = ("import sys, time\n"
              "from gymforge.core.config import GymforgeConfig, ModelSpec\n"
              "from gymforge.llm.serving import open_endpoint\n"
              "cfg = GymforgeConfig.model_validate({'evaluate': {'serving': {'backend': 'transformers'}}})\n"
              f"with open_endpoint(cfg, ModelSpec(name='s', source='checkpoint', model={str(checkpoint)!r}), "
              "checkpoint=None, served_name='s') as ep:\n"
              "    print(ep.pid, flush=True)\n"
              "    time.sleep(300)\n")
    tmp = tmp_path / "tmp"  # the caller's temporary directory
    tmp.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp)})
    try:
        server = int(parent.stdout.readline())
    finally:
        parent.kill()  # no cleanup runs in the caller
        parent.wait()
    deadline = time.monotonic() + 30
    while _alive(server):
        assert time.monotonic() < deadline, "the server outlived its caller"
        time.sleep(0.2)
    assert list(tmp.iterdir()) == [], "the server left its port file or log in the temporary directory"
