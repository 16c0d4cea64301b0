"""Where rloo's GPU step goes, one piece at a time (issue #46, item 1): attribution before and after each change.

    python benchmarks/gpu/gpu_micro.py --out OUTDIR                 # on the GPU (scripts/gpu_lease.sh runs it), <= 4 min
    python benchmarks/gpu/gpu_micro.py --cpu-tiny --out /tmp/micro  # the dry run (CI): every piece, tiny, on CPU

On the GPU check's random Qwen3-0.6B (benchmarks/gpu/gpu_check.py: 28 layers of 1024, a tied 151,936-word head) under
bf16 autocast, each piece is timed with CUDA events (median of its repeats after warm-ups) and reports the
`torch.cuda.max_memory_allocated` above what was allocated when it started (its own peak):

  head             the tiled LM head, forward + backward, 16 rows x 512 completion tokens: the path before #46
                   (`cast=False`, 110-row tiles: autocast's per-tile casts, fp32 `addmm_` for the weight gradient),
                   the new path (bf16 products with fp32 accumulation, the weight cast once, tiles by free memory),
                   the new path with the old tile size, and both as the frozen reference's no-grad forward
  decoder          one training micro-batch (16 rows x 640 tokens) forward + backward through `completion_logprobs`,
                   lean_activations on and off
  no_grad          one no-grad block of 16 rows (2 groups of 8) x (128 + 512): whole rows against the grouped layout,
                   the policy (fp32 weights under autocast) against the reference (bf16 weights)
  decode           one 256-row decode step at 384 cached tokens: eager with the fp32 model under autocast (keys
                   cached in fp32: Qwen3's k-norm), eager on the bf16 copy, static, and graphed; KV-cache bytes
  profile          torch.profiler's top kernels by device time over one decoder micro-batch forward + backward
                   (profile_training_micro_batch.txt)
  compile          the decoder micro-batch with each decoder layer compiled (regional torch.compile, item 5's
                   candidate), its compile time apart (CUDA only; last, so a short budget drops it first)

Writes OUTDIR/gpu_micro.json (rewritten after every piece) and OUTDIR/gpu_micro.md. Each piece is guarded (an error
is recorded, the rest runs) and skipped once the budget (--budget-s, 230 s on the GPU) is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (benchmarks/gpu/gpu_check.py: the model, its config, the environment)

SIZES = {  # rows, completion tokens, prompt tokens, decode rows, cached tokens, repeats, warm-ups, layers
    "cuda": dict(rows=16, completion=512, prompt=128, decode_rows=256, cached=384, repeats=5, warmups=2, layers=None),
    "cpu": dict(rows=4, completion=12, prompt=6, decode_rows=8, cached=10, repeats=2, warmups=1, layers=None),
}


def clock(device: str, function: Callable[[], object], repeats: int, warmups: int) -> dict:
    """Median milliseconds of `function` (CUDA events on a GPU, the wall clock on CPU) and its own peak allocation."""
    for _ in range(warmups):
        function()
    gpu_check.synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            function()
            times.append(1000 * (time.perf_counter() - begin))
    entry = {"ms_median": statistics.median(times), "ms_all": times}
    if device == "cuda":
        entry["peak_above_start_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9
    return entry


def autocast(device: str):
    return torch.autocast(device, dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def bf16_parameters(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy with bf16 parameters, fp32 buffers: what the reference and the sampler's copy hold."""
    from rloo.generation.half_weights import half_copy

    return half_copy(model, torch.bfloat16)


def head_piece(device: str, config: dict, sizes: dict) -> dict:
    from rloo.algo import lm_head

    vocab, width = config["vocab_size"], config["hidden_size"]
    tokens = sizes["rows"] * sizes["completion"]
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(1, tokens, width, device=device, generator=gen).requires_grad_()
    weight = (0.02 * torch.randn(vocab, width, device=device, generator=gen)).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), device=device, generator=gen)
    old_rows = lm_head.TILE_ELEMENTS // vocab
    new_rows = lm_head.tile_rows(vocab, device)

    def train(cast: bool, rows: int):
        def run():
            with autocast(device):
                logps, entropy = lm_head.tiled_head_logprobs(hidden, weight, None, targets, 0.7, None, True, rows, cast)
            (logps.sum() + 0.01 * entropy.sum()).backward()
            hidden.grad = weight.grad = None
        return run

    frozen = weight.detach()

    def reference(cast: bool, rows: int, head_weight: torch.Tensor):
        @torch.no_grad()
        def run():
            with autocast(device):
                lm_head.tiled_head_logprobs(hidden.detach(), head_weight, None, targets, 0.7, None, False, rows, cast)
        return run

    variants = {"before_46": train(False, old_rows), "new": train(True, new_rows),
                "new_old_tiles": train(True, old_rows),
                "reference_before_46": reference(False, old_rows, frozen),
                "reference_new_bf16_weight": reference(True, new_rows, frozen.bfloat16())}
    results = {name: clock(device, run, sizes["repeats"], sizes["warmups"]) for name, run in variants.items()}
    return {"tokens": tokens, "rows_before_46": old_rows, "rows_new": new_rows,
            "out_dtype_products": lm_head._OUT_DTYPE_PRODUCTS["cuda"] if device == "cuda" else None, **results}


def micro_batch(config: dict, sizes: dict, device: str, seed: int = 0) -> dict:
    rows = dict(gpu_check.correctness_rows(config, gpu_check.Plan(
        device=device, model=config, correctness_layers=0, rows=(sizes["rows"] // 8 or 1, min(8, sizes["rows"]),
                                                                  sizes["prompt"], sizes["completion"]),
        prompts=0, k=0, prompt_tokens=0, completion_tokens=0, micro_batch=0, warmup_steps=0, steps=0, long_prompts=0,
        long_completion_tokens=0, long_micro_batch=0, long_warmup_steps=0, long_steps=0, bf16=True, peak_size=0,
        budget_s=0), device, seed))
    return rows


def training_step(network: torch.nn.Module, rows: dict, device: str) -> Callable[[], None]:
    """One micro-batch forward + backward through `completion_logprobs` (the training pass's unit)."""
    def run():
        with autocast(device):
            logps, _ = gpu_check.whole_rows(network, rows, 0.7)
        (logps * rows["completion_mask"]).sum().backward()
        network.zero_grad(set_to_none=True)
    return run


def compile_piece(device: str, config: dict, sizes: dict, model: torch.nn.Module) -> dict:
    """Item 5's candidate, measured before it is built: each decoder layer compiled (`nn.Module.compile`, regional:
    the 28 identical layers share one compiled graph), lean_activations off; the compile time apart from the speed.
    CUDA only (on CPU inductor needs a C++ toolchain and minutes)."""
    if device != "cuda":
        return {"note": "CUDA only"}
    rows = micro_batch(config, sizes, device)
    network = copy.deepcopy(model)
    for layer in network.get_decoder().layers:
        layer.compile(dynamic=False)
    began = time.perf_counter()
    training_step(network, rows, device)()
    gpu_check.synchronize(device)
    compile_seconds = time.perf_counter() - began
    return {"compile_seconds": compile_seconds,
            "lean_off_compiled_layers": clock(device, training_step(network, rows, device), sizes["repeats"], 1)}


def decoder_piece(device: str, config: dict, sizes: dict, model: torch.nn.Module) -> dict:
    from rloo.passes.lean_activations import lean_activations

    rows = micro_batch(config, sizes, device)
    plain = model
    lean = copy.deepcopy(model)
    lean_activations(lean)

    results = {"lean_on": clock(device, training_step(lean, rows, device), sizes["repeats"], sizes["warmups"])}
    del lean
    results["lean_off"] = clock(device, training_step(plain, rows, device), sizes["repeats"], sizes["warmups"])
    results["tokens"] = int(rows["completion_ids"].numel() + rows["prompt_ids"].numel())
    return results


def no_grad_piece(device: str, config: dict, sizes: dict, model: torch.nn.Module) -> dict:
    from rloo.passes.logprobs import completion_logprobs
    from rloo.passes.prefix_logprobs import grouped_completion_logprobs

    rows = micro_batch(config, sizes, device, seed=1)
    group = min(8, sizes["rows"])
    reference = bf16_parameters(model)
    input_ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)

    def whole(network):
        @torch.no_grad()
        def run():
            with autocast(device):
                completion_logprobs(network, input_ids, mask, rows["completion_ids"].shape[1], 0.7)
        return run

    def grouped(network):
        @torch.no_grad()
        def run():
            with autocast(device):
                grouped_completion_logprobs(network, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
                                            rows["completion_mask"], group, 0.7, rows_per_pass=sizes["rows"])
        return run

    model.eval()
    try:
        return {name: clock(device, run, sizes["repeats"], sizes["warmups"]) for name, run in {
            "policy_whole_rows": whole(model), "policy_grouped": grouped(model),
            "reference_bf16_whole_rows": whole(reference), "reference_bf16_grouped": grouped(reference)}.items()}
    finally:
        model.train()


def decode_piece(device: str, config: dict, sizes: dict, model: torch.nn.Module) -> dict:
    from rloo.generation.fast import FastSampler
    from rloo.generation.half_weights import kv_bytes_per_token
    from rloo.generation.kv_cache import append_in_place_cache
    from rloo.passes.logprobs import cache_argument

    rows, cached, steps = sizes["decode_rows"], sizes["cached"], sizes["repeats"] + sizes["warmups"] + 2
    prompts = rows // 8 or 1
    gen = torch.Generator().manual_seed(2)
    ids = gpu_check.ordinary_ids(config, (prompts, cached), gen).to(device)
    half = bf16_parameters(model)
    model.eval()

    def variant(network, mode: str) -> dict:
        sampler = FastSampler(config["pad_token_id"], [config["eos_token_id"]], max_new_tokens=steps + 1,
                              decode_step=mode)
        with torch.no_grad(), autocast(device):
            cache = append_in_place_cache(network.config, room=steps + 1)
            name = cache_argument(network)
            network(input_ids=ids, attention_mask=torch.ones_like(ids), **{name: cache}, use_cache=True,
                    logits_to_keep=1)
            cache.batch_repeat_interleave(rows // prompts)
            mask = torch.ones(rows, cached, dtype=torch.long, device=device)
            step = sampler._step_function(network, cache, name, mask, None)
            token = torch.full((rows,), 5, dtype=torch.long, device=device)
            entry = clock(device, lambda: step(token), sizes["repeats"], sizes["warmups"])
            entry["kv_cache_gb"] = sum(layer.keys.numel() * layer.keys.element_size() * 2
                                       for layer in cache.layers) / 1e9
            entry["key_dtype"] = str(cache.layers[0].keys.dtype).replace("torch.", "")
            entry["step_kind"] = "eager" if type(step).__name__ == "function" else type(step).__name__  # after capture
        return entry

    try:
        results = {"rows": rows, "cached_tokens": cached,
                   "eager_fp32_model": variant(model, "eager"), "eager_bf16_copy": variant(half, "eager"),
                   "static_bf16_copy": variant(half, "static")}
        if device == "cuda":
            results["graphed_bf16_copy"] = variant(half, "graph")
        results["kv_bytes_per_token_bf16"] = kv_bytes_per_token(half)
        return results
    finally:
        model.train()


def profile_piece(device: str, config: dict, sizes: dict, model: torch.nn.Module, out_dir: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    rows = micro_batch(config, sizes, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    with profile(activities=activities) as profiler:
        with autocast(device):
            logps, _ = gpu_check.whole_rows(model, rows, 0.7)
        (logps * rows["completion_mask"]).sum().backward()
        model.zero_grad(set_to_none=True)
        gpu_check.synchronize(device)
    table = profiler.key_averages().table(sort_by=sort, row_limit=25)
    (out_dir / "profile_training_micro_batch.txt").write_text(table)
    top = sorted(profiler.key_averages(), key=lambda e: getattr(e, "device_time_total", 0) or e.cpu_time_total,
                 reverse=True)[:10]
    return {"file": "profile_training_micro_batch.txt", "top": [
        {"name": e.key[:80], "device_ms": (getattr(e, "device_time_total", 0) or 0) / 1000,
         "cpu_ms": e.cpu_time_total / 1000, "calls": e.count} for e in top]}


def render(data: dict) -> str:
    lines = [f"# rloo GPU micro-benchmark ({data['mode']}): {data.get('card', '?')}, {data['date']}", "",
             "| piece | variant | ms (median) | own peak GB |", "|---|---|---:|---:|"]
    for piece, entry in data["pieces"].items():
        if entry.get("status") != "ok":
            lines.append(f"| {piece} | {entry.get('status')}: {entry.get('error', entry.get('reason', ''))[:80]} | | |")
            continue
        for variant, value in entry.items():
            if isinstance(value, dict) and "ms_median" in value:
                peak = value.get("peak_above_start_gb")
                lines.append(f"| {piece} | {variant} | {value['ms_median']:.3g} | "
                             f"{'-' if peak is None else f'{peak:.3g}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu-tiny", action="store_true", help="the dry run: tiny sizes on CPU")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget (default 230 GPU, 300 CPU)")
    parser.add_argument("--pieces", default="", help="comma-separated pieces to run (default: all)")
    args = parser.parse_args(argv)
    if not args.cpu_tiny and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU, or --cpu-tiny for the dry run")
    device = "cpu" if args.cpu_tiny else "cuda"
    config, sizes = (gpu_check.TINY if args.cpu_tiny else gpu_check.QWEN3_0_6B), SIZES[device]
    budget = gpu_check.Budget(args.budget_s or (300.0 if args.cpu_tiny else 230.0))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {p.strip() for p in args.pieces.split(",") if p.strip()} or None
    import transformers

    transformers.logging.set_verbosity_error()
    card = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    data = {"mode": "cpu-tiny" if args.cpu_tiny else "gpu", "card": card, "date":
            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "command": " ".join(["gpu_micro.py", *(argv if argv is not None else sys.argv[1:])]), "sizes": sizes,
            "pieces": {}}

    def write():
        (out_dir / "gpu_micro.json").write_text(json.dumps(data, indent=1, default=str) + "\n")

    model = gpu_check.build_model(config, device)
    pieces = {"head": lambda: head_piece(device, config, sizes),
              "decoder": lambda: decoder_piece(device, config, sizes, model),
              "no_grad": lambda: no_grad_piece(device, config, sizes, model),
              "decode": lambda: decode_piece(device, config, sizes, model),
              "profile": lambda: profile_piece(device, config, sizes, model, out_dir),
              "compile": lambda: compile_piece(device, config, sizes, model)}  # last: the budget drops it first
    for name, function in pieces.items():
        if wanted is not None and name not in wanted:
            continue
        if budget.left() <= 0:
            data["pieces"][name] = {"status": "skipped", "reason": f"budget spent ({budget.seconds:.0f} s)"}
            continue
        began = time.perf_counter()
        try:
            data["pieces"][name] = {"status": "ok", **function()}
        except Exception as error:  # noqa: BLE001 - one piece's failure loses nothing else
            data["pieces"][name] = {"status": "error", "error": f"{type(error).__name__}: {error}",
                                    "traceback": traceback.format_exc()[-3000:]}
        data["pieces"][name]["seconds"] = time.perf_counter() - began
        if device == "cuda":
            torch.cuda.empty_cache()
        write()
        print(f"{name}: {data['pieces'][name]['status']} in {data['pieces'][name]['seconds']:.1f} s", flush=True)
    data["total_seconds"] = budget.used()
    write()
    table = render(data)
    (out_dir / "gpu_micro.md").write_text(table)
    print(table, flush=True)
    return data


if __name__ == "__main__":
    main()
