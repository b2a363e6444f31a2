"""The student: its base model and its tokenizer."""
