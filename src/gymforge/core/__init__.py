"""What every layer shares: the config models, the records stages write, the plan, task ids, atomic files, prompts."""
