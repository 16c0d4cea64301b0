"""RSS growth of one PagedSampler call (transformers' continuous batching) on a tiny model.

    python benchmarks/memory/paged_cache_memory.py                         # rloo's cache sizing (num_blocks for the call)
    python benchmarks/memory/paged_cache_memory.py --transformers-default  # transformers' own: from free memory

3 prompts x K=4, 7 new tokens, a tiny Qwen2 (char tokenizer). Left to itself, transformers sizes the KV cache
from free memory (60% of free RAM on CPU), whatever the call needs.
"""
import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's rloo
import rloo.generation.paged as paged  # noqa: E402
from rloo.toy import build_char_tokenizer, build_tiny_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transformers-default", action="store_true",
                        help="leave num_blocks, page_size and max_batch_tokens to transformers")
    options = parser.parse_args()
    if options.transformers_default:
        paged.cache_blocks = lambda *args: None
        paged.PAGE_SIZE, paged.MAX_BATCH_TOKENS = 256, None
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "12+34=", "7="]]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sampler = paged.PagedSampler(tokenizer.pad_token_id, [tokenizer.eos_token_id], max_new_tokens=7)
    batch = sampler.sample(model, prompts, num_generations=4)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'transformers default' if options.transformers_default else 'rloo'}: peak RSS {before:.0f} MB before "
          f"the call, {after:.0f} MB after ({after - before:+.0f} MB) for {batch.completion_ids.shape[0]} completions")


if __name__ == "__main__":
    main()
