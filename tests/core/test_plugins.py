"""core.plugins: backends found by entry point, and what a user without the offline extra is told."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from gymforge.core import plugins


def test_offline_backends_are_registered() -> None:
    from gymforge.offline.hub import OfflineHub

    assert plugins.load("offline-hub") is OfflineHub


def test_unknown_backend() -> None:
    with pytest.raises(plugins.BackendMissing, match="no gymforge backend 'nope'"):
        plugins.load("nope")


def test_backend_whose_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = EntryPoint(name="offline-hub", value="gymforge_no_such_module.hub:OfflineHub", group=plugins.GROUP)
    monkeypatch.setattr(plugins, "entry_points", lambda **kw: [missing] if kw.get("name") == "offline-hub" else [])
    with pytest.raises(plugins.BackendMissing, match=r"needs 'gymforge_no_such_module'.*\.\[offline\]"):
        plugins.load("offline-hub")
