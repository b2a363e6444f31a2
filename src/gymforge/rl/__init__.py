"""On-policy RL after SFT (docs/rl.md; issue #16): shaped rewards, GRPO-style updates, the train_rl stage."""
