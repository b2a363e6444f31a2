"""The LLM seam: one client factory, the spend ledger, model serving and its HTTP surface, reply parsing."""
