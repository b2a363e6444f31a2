"""gymforge tasks for other trainers and harnesses: TRL environments, Harbor task folders (out and in)."""
