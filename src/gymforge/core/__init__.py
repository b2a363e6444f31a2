"""What every stage shares: the config models, the records stages write, the plan, atomic files, prompts."""
