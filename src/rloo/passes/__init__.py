"""The passes that run a model: what turns a model and token ids into the tensors `algo/` works on.

- `logprobs`: completion log-probs and entropies of a model's forward, through the tiled LM head
  (`algo.lm_head`) where it can reach it; position ids that skip left padding.
- `prefix_logprobs`: the same with each group's prompt run once (the no-grad passes, and the opt-in
  `shared_prefix_forward` training pass).
- `mrope`: the 3-D rotary positions of Qwen2-VL-style models where rloo gives them itself.
- `lean_activations`: the policy's MLPs and norms keeping fewer tensors for backward, same gradients.
- `reference_sync`: the reference pulled toward the policy (TRL's `sync_ref_model`).
"""
