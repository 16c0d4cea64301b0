"""Generation: K completions of each prompt, behind the `Sampler` protocol (`base`).

- `base`: `SampledBatch`, the `Sampler` protocol, padding and end-of-completion masks.
- `fast`: `FastSampler`, one prefill per prompt and a hand-written decode loop (the default).
- `hf`: `GenerateSampler`, Hugging Face `generate` (the reference).
- `kv_cache`: the KV cache the fast sampler appends to in place.
- `stop`: cutting completions at stop strings.
- `vllm`: `VLLMSampler`, a vLLM engine in this process (colocate) or behind `rloo vllm-serve` (server);
  `vllm_server` is that server, `vllm_client` the trainer's side of it. Imported only when chosen.
"""

from rloo.generation.base import SampledBatch, Sampler, completion_mask_from_eos, left_pad
from rloo.generation.fast import FastSampler
from rloo.generation.hf import GenerateSampler

__all__ = ["SampledBatch", "Sampler", "FastSampler", "GenerateSampler", "left_pad", "completion_mask_from_eos"]
