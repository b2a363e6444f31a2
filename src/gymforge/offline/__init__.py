"""The offline teacher: a deterministic program behind an OpenAI-compatible endpoint on loopback.

It plays the teacher's roles (topics, proposals with tool calls, configs, starter code) so that the
pipeline's real `openai` client code paths run without a network or a model.
"""

from gymforge.offline.server import ensure_server, serve

__all__ = ["ensure_server", "serve"]
