"""On-policy RL after SFT (SPEC 3.9, issue #16): shaped rewards, GRPO-style updates, the train_rl stage."""
