"""What every config section shares: strict, frozen models, and the error a bad config raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A config section: unknown keys are an error (a misspelt key never passes silently) and values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """An invalid configuration, phrased with the offending key path."""
