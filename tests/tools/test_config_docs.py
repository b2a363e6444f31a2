"""docs/configuration.md's key table is generated from the config models and config.yaml (`gymforge schemas`)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from gymforge.core.config import GymforgeConfig, read_layers
from gymforge.tools import config_docs, schemas

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "configuration.md"


def test_the_key_table_in_the_docs_is_current():
    assert DOCS.read_text() == config_docs.expected_docs(DOCS, REPO / "config.yaml"), (
        "docs/configuration.md's key table is stale: run `gymforge schemas`")


def test_every_key_has_a_description():
    assert config_docs.undocumented() == [], "give these fields a description= (it is their row in the docs)"


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    return [leaf for k, v in tree.items()
            for leaf in (_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [prefix + k])]


def test_every_key_is_a_row_with_its_default_and_the_quick_starts_value():
    table = config_docs.render_key_table(read_layers(REPO / "config.yaml"))
    rows = {line.split(" | ")[0].removeprefix("| ").strip("`"): line for line in table.splitlines()
            if line.startswith("| `")}
    defaults = GymforgeConfig().model_dump()
    assert set(_leaves(defaults)) | {"base"} <= rows.keys()  # `base` is left out of dumps
    assert {"evaluate.models[].name", "evaluate.models[].source", "evaluate.models[].price.input_per_mtok"} <= rows.keys()
    assert rows["topics.n"].startswith("| `topics.n` | int ≥ 1 | `12` | `6` | Topic slots")  # the model's 12, config.yaml's 6
    assert " | `50` | `30` | " in rows["trajectories.max_steps"]  # the model's 50, config.yaml's 30
    assert " | `1` | `1` | " in rows["train.batch_size"]  # config.yaml repeats the default on purpose
    assert rows["llm.teacher.price.output_per_mtok"].split(" | ")[2:4] == ["`0`", "`10`"]
    assert "`research` \\| `post_training`" in rows["topics.kind"]
    assert "[docs/post-training.md#workflow-interface](post-training.md#workflow-interface)" in rows["agent.interface"]


def test_a_changed_setting_makes_the_table_stale_and_the_prose_around_it_stays(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # `gymforge schemas` reads ./config.yaml
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# Intro by hand\n\n{config_docs.BEGIN}\nold rows\n{config_docs.END}\n\nOutro by hand.\n")
    quick = tmp_path / "config.yaml"
    quick.write_text("topics: {n: 99}\n")
    text = config_docs.expected_docs(doc, quick)
    assert text.startswith("# Intro by hand\n\n") and text.endswith(f"{config_docs.END}\n\nOutro by hand.\n")
    assert "old rows" not in text and "| `topics.n` | int ≥ 1 | `12` | `99` |" in text

    args = SimpleNamespace(out=str(tmp_path / "schemas"), docs=str(doc), check=False)
    schemas.write_schemas(Path(args.out))
    with pytest.raises(SystemExit, match="configuration.md"):
        schemas.main(SimpleNamespace(**{**vars(args), "check": True}))
    schemas.main(args)  # regenerates the table
    assert doc.read_text() == config_docs.expected_docs(doc, REPO / "config.yaml") != text
    assert doc.read_text().startswith("# Intro by hand\n\n")


def test_a_doc_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="markers are missing"):
        config_docs.splice("# no table here\n", "| key |\n")
