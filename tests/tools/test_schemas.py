from pathlib import Path

from gymforge.tools.schemas import check_schemas

REPO = Path(__file__).resolve().parents[2]


def test_checked_in_schemas_match_the_models():
    stale = check_schemas(REPO / "schemas")
    assert not stale, f"regenerate with `gymforge schemas`: {stale}"


def test_check_detects_drift(tmp_path):
    from gymforge.tools.schemas import write_schemas

    write_schemas(tmp_path)
    assert check_schemas(tmp_path) == []
    (tmp_path / "config.schema.json").write_text("{}\n")
    assert check_schemas(tmp_path) == ["config.schema.json"]
