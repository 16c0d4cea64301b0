"""Prompts in, in a fixed order: checking and tokenizing prompts (`prompts`), which rows each
rollout takes (`schedule`), and loading datasets from files (`loading`)."""
