"""The teacher's endpoint and the budget (`llm`): how requests are phrased, reached, retried and priced."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gymforge.core.sections.base import ConfigError, Strict


class Price(Strict):
    """USD per million tokens; used for cost accounting and the budget."""

    input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens (reasoning tokens "
                                   "included).")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6


# Request fields the client sets itself; `extra_body` may not override them.
CLIENT_FIELDS = frozenset({"model", "messages", "tools", "temperature", "seed", "max_tokens", "max_completion_tokens",
                           "reasoning_effort", "stream", "stream_options", "n"})


class RequestOptions(Strict):
    """How requests are phrased for one OpenAI-compatible endpoint. The defaults suit a chat model (what vLLM,
    SGLang, Ollama and OpenAI's GPT-4-class models accept); a reasoning model (OpenAI's o-series and GPT-5 class)
    needs `token_param: max_completion_tokens` and `omit_params: [temperature]`, and takes `reasoning_effort`."""

    token_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens", description="The request field that carries the reply's token limit (`max_tokens` of the "
        "endpoint): reasoning models reject `max_tokens` and count their reasoning tokens within "
        "`max_completion_tokens` (docs/configuration.md#reasoning-model-endpoints).")
    omit_params: list[Literal["temperature", "seed"]] = Field(
        [], description="Sampling fields never sent, for endpoints that reject them (reasoning models accept only "
        "their default temperature); the endpoint's own default then applies.")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="Sent as `reasoning_effort` when set; which values a model accepts is the provider's to say.")
    extra_body: dict[str, Any] = Field(
        {}, description="Further fields merged into every request body (e.g. `verbosity: low`, or a provider's own "
        "options); they may not replace a field the client sets itself (model, messages, tools, the token limit, "
        "sampling).")

    @field_validator("extra_body")
    @classmethod
    def _no_client_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        if clash := sorted(CLIENT_FIELDS & value.keys()):
            raise ValueError(f"extra_body may not set {', '.join(clash)}: use the endpoint's own settings "
                             "(token_param, omit_params, reasoning_effort, temperature)")
        return value

    def request_identity(self) -> dict[str, Any]:
        """The settings here that change what the model answers (the token field's name does not), left out while
        at their defaults so that the rerun triggers and cache keys of a chat endpoint stay as they were."""
        out: dict[str, Any] = {}
        if self.omit_params:
            out["omit_params"] = sorted(self.omit_params)
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        if self.extra_body:
            out["extra_body"] = self.extra_body
        return out


class EndpointConfig(RequestOptions):
    """One chat model behind an OpenAI-compatible endpoint."""

    provider: Literal["offline", "openai", "local"] = Field(
        "offline",
        description="`offline`: the embedded deterministic teacher on loopback; "
        "`openai`: any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, Ollama) at `base_url`; "
        "`local`: a checkpoint gymforge serves itself (no API key).",
    )
    base_url: str | None = Field(None, validate_default=True,
                                 description="Endpoint URL ending in /v1; required for `openai` unless OPENAI_BASE_URL is set.")
    model: str = Field("gymforge-offline-teacher", description="Model name sent with every request.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Name of the environment variable holding the API key; the key itself is never stored.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature (part of the response cache key).")
    max_tokens: int = Field(4096, ge=1, description="The reply's token limit, whichever field carries it "
                            "(`token_param`); the budget may lower it for one attempt.")
    concurrency: int = Field(4, ge=1, description="Maximum simultaneous requests from one job.")
    timeout_s: float = Field(120.0, gt=0, description="Longest wait for one reply (reading it included).")
    connect_timeout_s: float = Field(10.0, gt=0, description="Longest wait to open a connection: an unreachable "
                                     "endpoint fails each attempt after this long, not after `timeout_s`.")
    max_retries: int = Field(6, ge=0, description="Retries of a transient failure, with "
                             "full-jitter exponential backoff that honours `Retry-After` "
                             "(docs/operations.md#faults-kills-and-the-budget).")
    token_ids: bool = Field(False, description="Ask for the prompt's and the reply's token ids and the sampled tokens' "
                            "log-probs (`logprobs` plus vLLM's `return_token_ids`); gymforge turns it on for the "
                            "checkpoints it serves itself. An external API may refuse the extra field.")
    price: Price = Price()
    offline_endpoint: Literal["chat", "reasoning"] = Field(
        "chat", description="What kind of endpoint the `offline` teacher imitates: `chat` accepts what a chat model "
        "does; `reasoning` behaves as an OpenAI reasoning model: it rejects `max_tokens` and any temperature but 1 "
        "with OpenAI's error (HTTP 400), and reports reasoning tokens in `usage`. Only for provider `offline`.")

    @model_validator(mode="after")
    def _offline_only(self) -> "EndpointConfig":
        if self.offline_endpoint != "chat" and self.provider != "offline":
            raise ValueError("offline_endpoint applies to the offline teacher only (provider: offline)")
        return self

    @field_validator("base_url")
    @classmethod
    def _reachable(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("provider") == "openai" and not os.environ.get("OPENAI_BASE_URL"):
            raise ValueError("base_url is required when provider is 'openai' (or set OPENAI_BASE_URL)")
        return value

    def api_key(self) -> str:
        # Read at call time so the key never lands in a config dump, cache key or log.
        if self.provider in ("offline", "local"):
            return self.provider
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"llm.teacher.api_key_env: environment variable {self.api_key_env} is not set")
        return key


class LLMConfig(Strict):
    budget_usd: float = Field(10.0, gt=0, description="Hard cap on spend across all stages (results dir): requests are "
                              "admitted while their realistic cost fits, with max_tokens lowered so that the worst "
                              "case of everything in flight does too; actual spend never exceeds it "
                              "(docs/operations.md#faults-kills-and-the-budget).")
    teacher: EndpointConfig = EndpointConfig()
