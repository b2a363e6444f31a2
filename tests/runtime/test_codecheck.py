"""Static checks: fatal pyflakes findings and dataset column references."""

from __future__ import annotations

import textwrap

import pytest

from gymforge.runtime.codecheck import check_columns, check_python, imports_gymforge_eval

COLUMNS = {"species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "sex", "year"}


def columns(src: str) -> list[str]:
    return check_columns(textwrap.dedent(src), "baseline.py", COLUMNS)


def test_missing_import_caught_with_hint() -> None:
    errors = check_python("import pandas as pd\n\nx = np.zeros(3)\n", "baseline.py")
    assert errors == ["baseline.py:3: undefined name 'np' (missing `import numpy as np`?)"]


def test_clean_file_passes_and_style_warnings_ignored() -> None:
    src = "import os\nimport numpy as np\n\n\ndef f(x):\n    unused = 1\n    return np.sqrt(x)\n"
    assert check_python(src, "a.py") == []


def test_syntax_error_has_line() -> None:
    [error] = check_python("x = 1\ndef f(:\n    pass\n", "a.py")
    assert error.startswith("a.py:2:") and "syntax error" in error


def test_compile_time_errors_beyond_parsing() -> None:
    [error] = check_python("x = 1\nreturn x\n", "a.py")
    assert error.startswith("a.py:2:") and "'return' outside function" in error


def test_wrong_column_flagged_with_suggestion() -> None:
    errors = columns(
        """
        from datasets import load_from_disk
        ds = load_from_disk("data")
        train = ds["train"].to_pandas()
        y = train["species_name"]
        """
    )
    assert errors == [
        "baseline.py:5: column 'species_name' is not in the dataset (columns: bill_depth_mm, bill_length_mm, "
        "body_mass_g, flipper_length_mm, island, sex, species, year); did you mean 'species'?"
    ]


def test_column_lists_drop_and_loc_checked() -> None:
    errors = columns(
        """
        import pandas as pd
        df = pd.read_csv("data/train.csv").dropna()
        X = df[["bill_length_mm", "flipper_len"]]
        X2 = df.drop(columns=["speces"])
        X3 = df.drop("yr", axis=1)
        m = df.loc[df["island"] == "Biscoe", "body_mass"]
        """
    )
    assert [e.split(" is not")[0] for e in errors] == [
        "baseline.py:4: column 'flipper_len'",
        "baseline.py:5: column 'speces'",
        "baseline.py:6: column 'yr'",
        "baseline.py:7: column 'body_mass'",
    ]


def test_hf_split_loading_and_split_keys() -> None:
    errors = columns(
        """
        from datasets import load_dataset
        train = load_dataset("penguins", split="train")
        full = load_dataset("penguins")
        a = full["validation"]
        b = train["islnd"]
        """
    )
    assert len(errors) == 1 and "'islnd'" in errors[0]


def test_created_columns_and_non_dataset_dicts_not_flagged() -> None:
    src = """
        import json
        import pandas as pd
        from datasets import load_from_disk

        def main():
            df = load_from_disk("data")["train"].to_pandas()
            df["bill_ratio"] = df["bill_length_mm"] / df["bill_depth_mm"]
            X = df[["bill_ratio", "body_mass_g"]]
            df = df.rename(columns={"sex": "gender"})
            g = df["gender"]
            metrics = {"accuracy": 0.9}
            print(json.dumps({"acc": metrics["accuracy"]}))
            sub = pd.read_csv("submission.csv")
            print(sub["prediction"])
            for c in ["bill_length_mm", "bill_depth_mm"]:
                df[c + "_sq"] = df[c] ** 2
            print(df["bill_length_mm_sq"])

        def evaluate(df):
            return df["anything"]

        main()
        """
    assert columns(src) == []
    assert check_python(textwrap.dedent(src), "baseline.py") == []


def test_reassignment_to_non_dataset_stops_tracking() -> None:
    errors = columns(
        """
        import pandas as pd
        from datasets import load_from_disk
        df = load_from_disk("data")["train"].to_pandas()
        df = pd.get_dummies(df, columns=["island"])
        a = df["island_Biscoe"]
        """
    )
    assert errors == []


def test_no_columns_known_means_no_findings() -> None:
    src = 'from datasets import load_from_disk\nload_from_disk("d")["train"]["x"]\n'
    assert check_columns(src, "a.py", set()) == []
    assert len(check_columns(src, "a.py", {"y"})) == 1


def test_own_helper_named_like_a_loader_is_not_followed() -> None:
    src = """
        import pickle

        def load_dataset(path):
            with open(path, "rb") as f:
                return pickle.load(f)

        data = load_dataset("d.pkl")
        xs = data["train"]["features"]
        """
    assert columns(src) == []
    assert len(columns(src.replace("def load_dataset", "def read_pickle"))) == 1


# ---- the evaluation contract: an evaluation script that imports gymforge_eval (`imports_gymforge_eval`) ----

FALLBACK = "except ImportError:\n    from importlib import import_module as import_submission\n"


@pytest.mark.parametrize("script", [
    "import gymforge_eval\n",
    "import json, gymforge_eval as channel\n",
    "import gymforge_eval.client\n",
    "from gymforge_eval import import_submission, load_pickle\n",
    "from gymforge_eval.client import call\n",
    "try:\n    from gymforge_eval import import_submission\n" + FALLBACK,
    "def main():\n    if True:\n        import gymforge_eval\n",
], ids=["import", "import-as", "import-submodule", "from-import", "from-submodule", "try-fallback", "nested"])
def test_a_script_that_imports_gymforge_eval_is_under_the_contract(script):
    assert imports_gymforge_eval(script)


@pytest.mark.parametrize("script", [
    "# scored through gymforge_eval\nfrom importlib import import_module as import_submission\n",
    "'''Reaches the submission through gymforge_eval.'''\nimport coloring\n",
    "NAME = 'gymforge_eval'\nimport importlib\nimportlib.import_module('coloring')\n",
    "import gymforge_evaluation\nfrom gymforge_evalkit import x\n",
    "from .gymforge_eval import import_submission\n",
    "from gymforge_eval import import_submission\nif True\n",  # the import is there, but the script does not parse
    "import gymforge_eval\0\n",
], ids=["comment", "docstring", "string", "other-module", "relative", "syntax-error", "null-byte"])
def test_a_script_that_only_mentions_gymforge_eval_is_not(script):
    assert "gymforge_eval" in script and not imports_gymforge_eval(script)
