"""What a pipeline step may read of the config: the sections its rule declares, and nothing else.

Each rule names the config sections its outputs depend on (`params: digest=CFG.digest("seed", "sandbox", ...)`,
its rerun trigger). The Snakefile writes every rule's list to one file (`write_declared`, path in
$GYMFORGE_READS), and a step run by a rule gets, instead of the whole `GymforgeConfig`, a `ConfigView` of it
(`for_step`): reading a key outside the rule's list raises `UndeclaredConfigRead`, naming the step, the key and
the fix. So a missed dependency, which would leave outputs stale without a word, fails the job instead, and every
end-to-end run of the workflow tests every rule it runs.

What may be read: the keys of the declared sections (`gymforge.core.config.SECTION_KEYS` maps the `rerun_view`
sections that are not config sections, `teacher` and `student`) plus `READABLE_EVERYWHERE` (locations, budget,
endpoint plumbing, plan sizes, resources: nothing a rerun depends on). The view wraps the validated model, which
stays the one source of truth: a readable section or key is returned as the model's own object, a partly readable
one as a view of it. Steps run by hand, and the tools, read the whole config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, cast

from pydantic import BaseModel

from gymforge.core.atomic import write_text
from gymforge.core.config import READABLE_EVERYWHERE, SECTION_KEYS, Digest, GymforgeConfig, declared_keys

log = logging.getLogger("gymforge.config")

# Set by the Snakefile (rules/common.smk): the JSON file of every rule's declared sections.
READS_ENV = "GYMFORGE_READS"


class UndeclaredConfigRead(BaseException):
    """A step read a config key its rule does not declare. A BaseException, like SystemExit: the steps record
    ordinary exceptions as an item's failure (a task that did not verify), and this is a bug in the rule."""

    reason_code = "undeclared_config"  # the job's failure record (gymforge.runtime.job.classify)


def _covers(keys: frozenset[str], path: str) -> bool:
    """Whether `path` or one of its parents is a readable key."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1))


def _below(keys: frozenset[str], path: str) -> bool:
    """Whether some readable key lies inside `path` (so `path` is readable in part)."""
    return any(k.startswith(path + ".") for k in keys)


class ConfigView:
    """A read-only view of a config model restricted to some dotted keys (see the module docstring). Typed for
    the steps as the model it wraps (`restrict`), so their code and annotations stay those of GymforgeConfig."""

    __slots__ = ("_model", "_prefix", "_keys", "_declared", "_step", "_rule_file")

    def __init__(self, model: BaseModel, keys: frozenset[str], *, declared: tuple[str, ...], step: str,
                 rule_file: str = "rules/*.smk", prefix: str = "") -> None:
        for name, value in (("_model", model), ("_prefix", prefix), ("_keys", keys), ("_declared", declared),
                            ("_step", step), ("_rule_file", rule_file)):
            object.__setattr__(self, name, value)

    def _child(self, model: BaseModel, path: str, keys: frozenset[str] | None = None) -> ConfigView:
        return ConfigView(model, self._keys if keys is None else keys, declared=self._declared, step=self._step,
                          rule_file=self._rule_file, prefix=path + ".")

    def _refuse(self, key: str, what: str = "") -> UndeclaredConfigRead:
        if not key:  # the whole config (`cfg.model_dump()`)
            return UndeclaredConfigRead(f"gymforge step `{self._step}` read the whole config{what}: a step reads "
                                        f"only the sections its rule declares in {self._rule_file}")
        # the rerun_view sections that would make `key` readable: a narrower one first (student: train.student)
        sections = [s for s, keys in SECTION_KEYS.items() if _covers(frozenset(keys), key)]
        sections.append(key.split(".")[0])
        declared = ", ".join(f'"{s}"' for s in self._declared) or "nothing"
        return UndeclaredConfigRead(
            f"gymforge step `{self._step}` read config `{key}`{what}, which its rule does not declare (it declares "
            f"{declared}), so its outputs would go stale when that changes: add "
            + " or ".join(f'"{s}"' for s in dict.fromkeys(sections))
            + f" to the rule's CFG.digest(...) in {self._rule_file} (to `covered=` if another of its params "
            "already tracks it)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for dunder hooks
            raise AttributeError(name)
        model = self._model
        path = self._prefix + name
        if name in type(model).model_fields:
            value = getattr(model, name)
            if _covers(self._keys, path):
                return value
            if isinstance(value, BaseModel) and _below(self._keys, path):
                return self._child(value, path)
            raise self._refuse(path)
        attribute = getattr(type(model), name, None)
        if isinstance(attribute, property):  # computed from fields: read them through the view
            return attribute.fget(self)  # type: ignore[misc]
        if name in ("digest", "rerun_view") and isinstance(model, GymforgeConfig):
            return getattr(self, f"_{name}")
        if name == "model_copy":
            return self._model_copy
        raise self._refuse(self._prefix.rstrip("."), f" (`.{name}` reads all of it)")

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("a step's config is read-only")

    def __iter__(self) -> Any:
        raise self._refuse(self._prefix.rstrip("."), " (iterating reads all of it)")

    def __repr__(self) -> str:
        return f"ConfigView({type(self._model).__name__}, step={self._step!r}, declared={self._declared!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._model, self._keys, self._declared, self._step, self._rule_file, self._prefix))

    # -- the GymforgeConfig methods a step calls --------------------------------------------------------------

    def _check_sections(self, sections: tuple[str, ...] | list[str]) -> None:
        for section in sections:
            for key in declared_keys([section]):
                if not _covers(self._keys, key):
                    raise self._refuse(key, " (through cfg.digest / cfg.rerun_view)")

    def _digest(self, *sections: str, covered: tuple[str, ...] = ()) -> str:
        self._check_sections(sections)
        return cast(GymforgeConfig, self._model).digest(*sections, covered=covered)

    def _rerun_view(self) -> dict[str, Any]:
        full = cast(GymforgeConfig, self._model).rerun_view()
        return _DeclaredSections(self, {s: v for s, v in full.items()
                                        if all(_covers(self._keys, k) for k in declared_keys([s]))})

    def _model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> ConfigView:
        # The updated keys hold what the step put there (read through this view): readable in the copy.
        update = update or {}
        keys = self._keys | {self._prefix + k for k in update}
        model = self._model.model_copy(update=update, deep=deep)
        return ConfigView(model, keys, declared=self._declared, step=self._step, rule_file=self._rule_file,
                          prefix=self._prefix)


class _DeclaredSections(dict):
    """`rerun_view()` of a view: the declared sections; any other one raises like a read."""

    def __init__(self, view: ConfigView, sections: dict[str, Any]) -> None:
        super().__init__(sections)
        self._view = view

    def __missing__(self, section: str) -> Any:
        raise self._view._refuse(section, " (through cfg.rerun_view)")


def _rebuild(model: BaseModel, keys: frozenset[str], declared: tuple[str, ...], step: str, rule_file: str,
             prefix: str) -> ConfigView:
    return ConfigView(model, keys, declared=declared, step=step, rule_file=rule_file, prefix=prefix)


def restrict(cfg: GymforgeConfig, declared: tuple[str, ...] | list[str], *, step: str,
             rule_file: str = "rules/*.smk") -> GymforgeConfig:
    """`cfg` as the step `step` may read it: the sections (or dotted keys) `declared`, plus READABLE_EVERYWHERE."""
    keys = declared_keys(tuple(declared)) | frozenset(READABLE_EVERYWHERE)
    view = ConfigView(cfg, keys, declared=tuple(declared), step=step, rule_file=rule_file)
    return cast(GymforgeConfig, view)


# -- the Snakefile's side and the job's ------------------------------------------------------------------------


def declared(params: Iterable[Any]) -> list[str]:
    """The sections a rule declares: the `reads` of the digests among its params (in order, once each)."""
    return list(dict.fromkeys(s for value in params if isinstance(value, Digest) for s in value.reads))


def write_declared(rules: dict[str, tuple[str, Iterable[Any]]], directory: Path | str) -> Path:
    """Write every rule's declared sections, from {rule: (its file, its params)}, to a content-addressed file
    under `directory` (so a job reads the version its Snakemake parsed); returns its path."""
    entries = {name: {"reads": declared(params), "file": file} for name, (file, params) in rules.items()}
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    path = Path(directory) / f"reads-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():
        write_text(path, text)
    return path


def for_step(cfg: GymforgeConfig, rule: str) -> GymforgeConfig:
    """The config a step run by rule `rule` gets: restricted to the rule's declared sections when a Snakemake job
    runs it ($GYMFORGE_READS is set), else `cfg` itself (a step run by hand, a test, a tool)."""
    path = os.environ.get(READS_ENV)
    if not path:
        return cfg
    entry = json.loads(Path(path).read_text()).get(rule) or {"reads": [], "file": "rules/*.smk"}
    log.info("config view of rule %s: %s", rule, ", ".join(entry["reads"]) or "nothing declared")
    return restrict(cfg, tuple(entry["reads"]), step=rule, rule_file=entry["file"])
