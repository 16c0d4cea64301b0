"""TR-DPO-style reference syncing (TRL's `sync_ref_model`): every `ref_model_sync_steps` optimizer
steps the frozen reference moves toward the policy,

    ref <- (1 - alpha) * ref + alpha * policy,        alpha = ref_model_mixup_alpha,

so the KL penalty measures the distance to a recent policy rather than to the initial one.
alpha = 1 copies the policy; alpha = 0 leaves the reference as it was.
"""

from __future__ import annotations

import torch


def mixed(reference: torch.Tensor, policy: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1 - alpha) * reference + alpha * policy, computed in float32 and returned in reference's dtype.

    Shapes: reference and policy have the same shape (any); the result has it too.
    """
    mix = (1.0 - alpha) * reference.float() + alpha * policy.float()
    return mix.to(reference.dtype)


@torch.no_grad()
def sync_reference(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> int:
    """Move every reference parameter toward the policy's parameter of the same name, in place.

    Both modules must have the same parameter names and shapes (the reference is a copy of the
    policy); a mismatch is an error rather than a partial sync. Returns the number of tensors mixed.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"ref_model_mixup_alpha={alpha!r} must lie in [0, 1].")
    policy_params = dict(policy.named_parameters())
    reference_params = dict(reference.named_parameters())
    if policy_params.keys() != reference_params.keys():
        missing = sorted(policy_params.keys() ^ reference_params.keys())[:3]
        raise ValueError(f"the reference and the policy have different parameters (e.g. {missing}); "
                         f"sync_ref_model needs the reference to be a copy of the policy.")
    for name, ref in reference_params.items():
        ref.data.copy_(mixed(ref.data, policy_params[name].data, alpha))
    return len(reference_params)
