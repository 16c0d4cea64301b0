"""`rloo vllm-serve`'s command line: its flags, the limits they set, and the refusal to serve another machine
without a token (generation/vllm_server.py runs the server)."""

from __future__ import annotations

import argparse
import ipaddress
import socket

from rloo.generation.vllm_lora import MAX_LORA_RANKS
from rloo.generation.vllm_server_guards import MB, TOKEN_ENV, ServerLimits, half_the_memory


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rloo vllm-serve",
                                     description="Serve a vLLM engine for sampler='vllm', vllm_mode='server'. "
                                                 "See docs/launching.md for running it across machines safely.")
    parser.add_argument("--model", required=True, help="model folder (or Hub id) the policy starts from")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only); "
                        "any other address needs a token")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, ... (auto: the checkpoint's); "
                        "use the policy's dtype so the engine's log-probs match the trainer's")
    parser.add_argument("--max_model_length", type=int, default=None, help="longest prompt + completion (tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--token", default=None, help=f"a shared secret every request must carry; the trainer sends "
                        f"its {TOKEN_ENV}. Default: this process's {TOKEN_ENV}. Prefer the environment variable: "
                        f"other users of the machine can read a command line (ps)")
    parser.add_argument("--allow_no_token", action="store_true",
                        help="serve an address other than loopback without a token (anyone who reaches the port "
                             "can then replace the weights)")
    defaults = ServerLimits(pending_bytes=0)
    parser.add_argument("--max_request_mb", type=float, default=defaults.request_bytes / MB,
                        help="largest /generate body (MiB; default %(default)s)")
    parser.add_argument("--max_chunk_mb", type=float, default=defaults.chunk_bytes / MB,
                        help="largest weight chunk (MiB; default %(default)s); a single tensor must fit in one")
    parser.add_argument("--max_pending_chunks", type=int, default=defaults.pending_chunks,
                        help="most chunks of one push held before its final chunk (default %(default)s)")
    parser.add_argument("--max_pending_mb", type=float, default=None,
                        help="most bytes of one push held before its final chunk (MiB; default: half the "
                             "machine's memory); at least the model's size in the trainer's dtype")
    parser.add_argument("--socket_timeout", type=float, default=defaults.socket_timeout,
                        help="seconds a client may stall mid-request before it is dropped (default %(default)s)")
    parser.add_argument("--max_connections", type=int, default=defaults.connections,
                        help="open connections served at once (default %(default)s); more are answered 503")
    parser.add_argument("--max_image_megapixels", type=float, default=defaults.image_pixels / MB,
                        help="most pixels (in units of 2**20) of the images of one /generate request, together "
                             "(default %(default)s)")
    parser.add_argument("--enable_lora", action="store_true", help="serve LoRA adapters (the trainer's "
                        "vllm_lora_sync='adapters' then sends adapter tensors alone after each optimizer step)")
    parser.add_argument("--max_lora_rank", type=int, default=64, choices=MAX_LORA_RANKS,
                        help="with --enable_lora: the largest adapter rank served (default %(default)s)")
    parser.add_argument("--max_loras", type=int, default=4, help="with --enable_lora: adapter versions held at once "
                        "(default %(default)s; async_rollouts needs max_staleness + 2)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def limits_from(args: argparse.Namespace) -> ServerLimits:
    """The ServerLimits the flags ask for; a non-positive value is an error naming its flag."""
    for flag in ("max_request_mb", "max_chunk_mb", "max_pending_chunks", "max_pending_mb", "socket_timeout",
                 "max_connections", "max_image_megapixels"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise SystemExit(f"rloo vllm-serve: --{flag} must be > 0, got {value}")
    pending = int(args.max_pending_mb * MB) if args.max_pending_mb is not None else half_the_memory()
    return ServerLimits(request_bytes=int(args.max_request_mb * MB), chunk_bytes=int(args.max_chunk_mb * MB),
                        pending_chunks=args.max_pending_chunks, pending_bytes=pending,
                        socket_timeout=args.socket_timeout, connections=args.max_connections,
                        image_pixels=int(args.max_image_megapixels * MB))


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_exposure(host: str, token: str | None, allow_no_token: bool) -> None:
    """Refuse to serve a non-loopback address without a token unless told to (--allow_no_token)."""
    if token is None and not allow_no_token and not is_loopback(host):
        raise SystemExit(f"rloo vllm-serve: --host {host} is reachable from other machines, and without a token anyone "
                         f"who reaches the port can replace the model's weights. Set {TOKEN_ENV} (in the server's and "
                         f"the trainer's environment), or pass --allow_no_token on a network you trust; see "
                         f"docs/launching.md.")
