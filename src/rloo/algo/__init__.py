"""The RLOO math as pure tensor functions: torch only, no models, no trainer state.

- `advantages`: leave-one-out baseline and the other estimators, whitening.
- `kl`: per-token KL estimators, the KL folded into the reward, per-token KL returns.
- `shaping`: what happens to scores before the baseline (missing-EOS penalty, normalisation, clipping).
- `loss`: clipped policy losses and the loss-aggregation modes (numerators and denominators).
- `lm_head`: log-probs and entropies from hidden states and the head's weight, a tile of tokens at a time.
- `importance`, `off_policy`, `group_filter`: corrections for another engine's or an older policy's samples.

The passes that run a model live in `rloo.passes`.
"""
