"""The training forward with each group's prompt run once (Prefix Grouper, arXiv 2506.05433).

The plain training pass runs every row [prompt | completion] whole, so each prompt is run (and
back-propagated through) once per completion. Here the rows of one prompt in a micro-batch are
packed into one sequence

    [prompt | c_1 | c_2 | ... | c_m]

with a block attention mask (prompt tokens attend causally to the prompt; completion k attends to
the prompt and causally to its own tokens, never to another completion) and per-segment position
ids (each completion starts where its prompt ends). Every completion token then sees exactly what it
sees in the plain pass, so the log-probs are the same, and because the prompt's hidden states are
shared by the m completions their gradients add up as the plain pass's m copies do: the same
gradients, with the prompt computed once.

The mask is a custom 4D mask, which transformers passes through to the `eager` and `sdpa` attention
implementations (a float additive mask for `eager`, a boolean one for `sdpa`); flash-attention
kernels take no such mask and are refused. The log-probs go through the tiled LM head
(`algo.lm_head`); a model whose head it cannot reach is refused too.
"""

from __future__ import annotations

import torch

from .lm_head import tiled_head_logprobs
from .logprobs import reachable_head

MASKED_IMPLEMENTATIONS = ("eager", "sdpa")


def check_model(model: torch.nn.Module) -> None:
    """Refuse a model the shared-prefix forward cannot run exactly, with the fix in the message."""
    inner = getattr(model, "module", model)
    implementation = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    if implementation not in MASKED_IMPLEMENTATIONS:
        raise ValueError(f"shared_prefix_forward needs attn_implementation in {MASKED_IMPLEMENTATIONS}, which take "
                         f"a custom attention mask; the model uses {implementation!r}. Load it with "
                         f"model_init_kwargs={{'attn_implementation': 'sdpa'}} or turn shared_prefix_forward off.")
    if reachable_head(model) is None:
        get_head = getattr(inner, "get_output_embeddings", None)
        found = type(get_head()).__name__ if callable(get_head) else "none"
        raise ValueError(f"shared_prefix_forward needs a plain nn.Linear LM head with no logit scaling (found "
                         f"{found}, e.g. LoRA on lm_head); leave lm_head out of the LoRA targets or turn "
                         f"shared_prefix_forward off.")


def prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive rows that hold the same (B, P) prompt."""
    same = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(dim=1)  # (B - 1,)
    starts = [0] + [row + 1 for row in (~same).nonzero().flatten().tolist()]
    return list(zip(starts, starts[1:] + [prompt_ids.shape[0]]))


def pack_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, pad_id: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack each run of rows sharing a prompt into [prompt | c_1 | ... | c_m], right-padded to one length.

    Args:
        prompt_ids: (B, P) left-padded prompts.
        prompt_mask: (B, P) 1 for real prompt tokens.
        completion_ids: (B, C) completions (padding after the end is kept: it sits after every real token).
        pad_id: token id for the packing padding.

    Returns:
        input_ids (S, L), position_ids (S, L), segments (S, L) (0 prompt, k for completion k >= 1,
        -1 packing padding), and source (B, C): for completion token t of row b, the flat index into
        (S * L) of the position that predicts it (the prompt's last token for t = 0).
    """
    runs = prompt_runs(prompt_ids, prompt_mask)
    width = completion_ids.shape[1]
    lengths = [int(prompt_mask[start].sum()) + (end - start) * width for start, end in runs]
    size = max(lengths)
    device = completion_ids.device
    input_ids = torch.full((len(runs), size), pad_id, dtype=completion_ids.dtype, device=device)
    position_ids = torch.zeros(len(runs), size, dtype=torch.long, device=device)
    segments = torch.full((len(runs), size), -1, dtype=torch.long, device=device)
    source = torch.empty(completion_ids.shape, dtype=torch.long, device=device)
    steps = torch.arange(width, device=device)
    for sequence, (start, end) in enumerate(runs):
        prompt = prompt_ids[start][prompt_mask[start].bool()]  # (p,)
        p = prompt.shape[0]
        input_ids[sequence, :p] = prompt
        position_ids[sequence, :p] = torch.arange(p, device=device)
        segments[sequence, :p] = 0
        for k, row in enumerate(range(start, end)):
            first = p + k * width  # where completion k starts in the packed sequence
            input_ids[sequence, first : first + width] = completion_ids[row]
            position_ids[sequence, first : first + width] = p + steps
            segments[sequence, first : first + width] = k + 1
            # Token t is predicted by the position before it: the prompt's last token for t = 0.
            source[row] = sequence * size + first + steps - 1
            source[row, 0] = sequence * size + p - 1
    return input_ids, position_ids, segments, source


def block_mask(segments: torch.Tensor) -> torch.Tensor:
    """(S, L) segments -> (S, 1, L, L) bool, True where query i may attend to key j.

    Causal, and a completion's key is seen only from its own segment; every position sees itself, so
    that packing padding has no fully masked row (which gives NaN in attention)."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()  # (L, L)
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)  # (S, L, 1), (S, 1, L)
    visible = ((key == 0) | (key == query)) & (key >= 0) & (query >= 0)  # (S, L, L)
    eye = torch.eye(length, dtype=torch.bool, device=segments.device)
    return ((visible & causal) | eye).unsqueeze(1)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the completion tokens, rows sharing a prompt packed into one sequence.

    Args:
        model: a causal LM with `eager` or `sdpa` attention whose head `reachable_head` finds.
        prompt_ids: (B, P) left-padded prompts; consecutive rows with the same prompt are packed together.
        prompt_mask: (B, P) 1 for real prompt tokens.
        completion_ids: (B, C) completions, right-padded.
        temperature, with_entropy, entropy_grad: as in `logprobs.completion_logprobs`.

    Returns:
        (B, C) fp32 log-probs, and (B, C) entropies or None; equal to `completion_logprobs` on the
        rows whole at every real completion token, with the same gradients.
    """
    check_model(model)
    inner, head = getattr(model, "module", model), reachable_head(model)
    implementation = inner.config._attn_implementation
    input_ids, position_ids, segments, source = pack_groups(prompt_ids, prompt_mask, completion_ids)
    mask = block_mask(segments)  # (S, 1, L, L)
    if implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
            ~mask, torch.finfo(torch.float32).min)
    caught = {}

    def catch_hidden(module, args):  # (S, L, H) -> an empty (S, 0, H): the head builds no logits
        caught["hidden"] = args[0]
        return (args[0][..., :0, :],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(catch_hidden)
    try:
        model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
    finally:
        handle.remove()
    hidden = caught["hidden"]  # (S, L, H)
    hidden = hidden.reshape(-1, hidden.shape[-1])[source]  # (B, C, H)
    softcap = getattr(inner.config, "final_logit_softcapping", None)
    logps, entropy = tiled_head_logprobs(hidden, head.weight, head.bias, completion_ids, temperature, softcap,
                                         with_entropy)
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return logps, entropy
