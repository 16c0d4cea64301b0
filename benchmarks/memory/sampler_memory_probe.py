"""RSS growth of rloo's FastSampler alone, to tell a leak from allocator retention.

    python benchmarks/memory/sampler_memory_probe.py 1024                                # as the trainer runs it
    RLOO_KEEP_MALLOC_SETTINGS=1 python benchmarks/memory/sampler_memory_probe.py 1024    # glibc's default malloc

The trainer fixes glibc's mmap threshold (rloo/run/allocator.py); RLOO_KEEP_MALLOC_SETTINGS=1 leaves glibc's
default, whose dynamic threshold keeps the decode loop's freed (rows, V) buffers on a fragmenting heap.

2 prompts x K=4 and N new tokens on memory.py's random Qwen2 (vocab 151,936; no EOS can be drawn, so
every row runs to N). Run `benchmarks/memory/memory.py --lengths 4096` once first: it saves the model.
"""
import resource
import sys
import time
from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this checkout's rloo
from rloo.generation import FastSampler  # noqa: E402
from rloo.run.allocator import return_large_buffers_to_os  # noqa: E402

torch.set_num_threads(1)
print('mmap threshold fixed by rloo:', return_large_buffers_to_os())
n = int(sys.argv[1])
m = transformers.AutoModelForCausalLM.from_pretrained(str(HERE.parent / '.cache' / 'qwen2-v151936-h64-l2-p4160'),
                                                      dtype=torch.float32).eval()
prompts = [[(7 * i + j) % 5000 + 2 for j in range(16)] for i in range(2)]
s = FastSampler(pad_token_id=0, eos_token_ids=[10**6], max_new_tokens=n, do_sample=True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
s.sample(m, prompts, num_generations=4)
growth_mb = round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
print(n, "tokens: sampler RSS growth MB", growth_mb, "in", round(time.perf_counter() - start), "s")
