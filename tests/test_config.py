import pytest

from gymforge.core.config import ConfigError, load_config, validate_config


def test_default_config_file_is_valid_and_offline():
    cfg = load_config("config.yaml")
    assert cfg.llm.teacher.provider == "offline"
    assert cfg.datasets.hub == "offline"
    assert cfg.topics.n == 12


@pytest.mark.parametrize(
    "raw, key, words",
    [
        ({"topics": {"n": 0}}, "topics.n", "greater than or equal to 1"),
        ({"llm": {"teacher": {"temperature": 5}}}, "llm.teacher.temperature", "less than or equal to 2"),
        ({"datasets": {"hub": "kaggle"}}, "datasets.hub", "'offline' or 'huggingface'"),
        ({"llm": {"budget_usd": -1}}, "llm.budget_usd", "greater than 0"),
        ({"llm": {"budget_usd": 0}}, "llm.budget_usd", "greater than 0"),
        ({"topics": {"batchsize": 4}}, "topics.batchsize", "unknown key"),
    ],
)
def test_invalid_value_names_its_key_path(raw, key, words):
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    assert f"{key}:" in str(err.value)
    assert words in str(err.value)


def test_openai_provider_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match=r"llm\.teacher\.base_url: Value error, base_url is required"):
        validate_config({"llm": {"teacher": {"provider": "openai"}}})


def test_api_key_comes_only_from_the_named_variable(monkeypatch):
    cfg = validate_config({"llm": {"teacher": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1",
                                               "api_key_env": "MY_TEACHER_KEY"}}})
    monkeypatch.delenv("MY_TEACHER_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_TEACHER_KEY is not set"):
        cfg.llm.teacher.api_key()
    monkeypatch.setenv("MY_TEACHER_KEY", "sk-secret-value")
    assert cfg.llm.teacher.api_key() == "sk-secret-value"
    assert "sk-secret-value" not in cfg.model_dump_json()


def test_rerun_digest_ignores_topic_count_budget_and_price():
    base = validate_config({})
    changed = validate_config({"topics": {"n": 500}, "llm": {"budget_usd": 99, "teacher": {"price": {"input_per_mtok": 3}}}})
    assert base.digest("seed", "teacher", "topics") == changed.digest("seed", "teacher", "topics")
    reseeded = validate_config({"seed": 1})
    assert base.digest("seed", "teacher", "topics") != reseeded.digest("seed", "teacher", "topics")
