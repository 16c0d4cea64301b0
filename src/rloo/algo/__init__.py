"""The RLOO math as pure tensor functions: torch only, no models, no trainer state.

- `advantages`: leave-one-out baseline and the other estimators, whitening.
- `kl`: per-token KL estimators, the KL folded into the reward, per-token KL returns.
- `shaping`: what happens to scores before the baseline (missing-EOS penalty, normalisation, clipping).
- `loss`: clipped policy losses and the loss-aggregation modes (numerators and denominators).
- `logprobs`: completion log-probs and entropies from a model's logits.
- `lm_head`, `prefix_logprobs`: the same log-probs a tile of the vocabulary, or a prompt, at a time.
- `lean_activations`: the policy's MLPs and norms keeping fewer tensors for backward, same gradients.
"""
