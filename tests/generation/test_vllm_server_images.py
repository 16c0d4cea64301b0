"""Prompts with images over `rloo vllm-serve`'s HTTP layer, without vLLM: rloo's client against the server's own
request handler serving a stand-in engine. The images arrive as the client's pixels, the client checks the prompt
ids the engine ran, and every malformed request is refused with a 4xx naming what is wrong, the engine untouched,
the server serving the next request. The real engine: tests/generation/test_vllm_server_vision.py."""

import base64
import json
import math
import re

import numpy as np
import pytest
from test_vllm_server_guards import WAIT, exchange, post, serve  # noqa: F401  (serve: the fixture)

from rloo.generation.vllm_client import HTTPEngine, ServerError, png_base64
from rloo.generation.vllm_server import ServerLimits, WeightServer

EXPANDED = 9  # the stand-in engine's expansion of a placeholder: ids 9, 9, 9 (three per image)


class ImageEngine:
    """Records what reaches it; expands each placeholder id 5 into three 9s, as a vLLM engine would into its image
    tokens, and returns one completion of `n` ids per sample."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, params):
        self.calls.append(("text", prompts, None, n, params))
        return [[([7], [-0.5]) for _ in range(n)] for _ in prompts]

    def run_with_images(self, prompts, images, n, params):
        self.calls.append(("images", prompts, images, n, params))
        ran = [[t for token in ids for t in ([EXPANDED] * 3 if token == 5 else [token])] for ids in prompts]
        return [[([7, k], [-0.5, -0.25]) for k in range(n)] for _ in prompts], ran

    def load_weights(self, weights):
        pass


def pictures(*sizes, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)) for w, h in sizes]


def expanded(ids):
    return [t for token in ids for t in ([EXPANDED] * 3 if token == 5 else [token])]


def test_images_reach_the_engine_pixel_for_pixel_with_the_template_ids(serve):  # noqa: F811
    server, port = serve(engine=ImageEngine())
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    prompts = [[1, 5, 2], [1, 5, 5, 3, 4]]  # one image, then two
    images = [pictures((20, 12)), pictures((8, 8), (13, 30), seed=1)]
    params = {"max_tokens": 2, "logit_bias": {9: float("-inf")}}
    grouped = client.generate_with_images(prompts, images, [expanded(p) for p in prompts], 3, params)
    assert grouped == [[([7, k], [-0.5, -0.25]) for k in range(3)]] * 2
    kind, got_prompts, got_images, n, got_params = server.engine.calls[0]
    assert kind == "images" and got_prompts == prompts and n == 3
    assert got_params["logit_bias"] == {9: -math.inf}  # token ids again (JSON made them strings), -inf kept
    assert [len(each) for each in got_images] == [1, 2]
    for sent, got in zip(sum(images, []), sum(got_images, [])):
        assert got.mode == "RGB" and np.array_equal(np.asarray(sent), np.asarray(got))  # PNG: lossless


def test_the_client_refuses_a_prompt_the_engine_ran_as_other_ids(serve):  # noqa: F811
    _, port = serve(engine=ImageEngine())
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    prompts = [[1, 5, 2], [1, 5, 3]]
    wrong = [expanded(prompts[0]), prompts[1]]  # the processor expanded prompt 1 otherwise
    with pytest.raises(RuntimeError, match="vLLM expanded prompt 1's image placeholders into 5 ids, not the processor's 3"):
        client.generate_with_images(prompts, [pictures((4, 4)), pictures((4, 4))], wrong, 1, {})


def png(width, height):
    return png_base64(pictures((width, height))[0])


@pytest.mark.parametrize(("request_body", "status", "match"), [
    ({"images": [["not base64!"]]}, 400, "image 0 of prompt 0 is not base64"),
    ({"images": [[base64.b64encode(b"GIF89a not a png").decode()]]}, 400, "image 0 of prompt 0 is not a PNG image"),
    ({"images": [[base64.b64encode(base64.b64decode(png(16, 16))[:60]).decode()]]}, 400, "not a readable PNG image"),
    ({"images": [[png(4, 4)], [png(4, 4)]]}, 400, "images must be one list per prompt \\(1 lists\\)"),
    ({"images": [[3]]}, 400, "images must be one list per prompt"),
    ({"images": "abc"}, 400, "images must be one list per prompt"),
    ({"images": [[png(40, 30)]]}, 413, "over 1000 pixels together \\(image 0 of prompt 0 is 40x30\\).*--max_image_megapixels"),
    ({"prompts": [[1, -5]]}, 400, "prompts must be a list of non-empty lists of token ids"),
    ({"prompts": [["a"]]}, 400, "prompts must be a list"),
    ({"prompts": [[]]}, 400, "prompts must be a list"),
    ({"n": 0}, 400, "n must be an integer >= 1"),
    ({"params": [1]}, 400, "params must be a JSON object"),
    ({"params": {"logit_bias": {"x": 1.0}}}, 400, "params.logit_bias must map token ids to numbers"),
    ({"params": {"logit_bias": {"3": float("nan")}}}, 400, "params.logit_bias must map token ids"),
])
def test_a_malformed_request_is_refused_by_name_and_the_server_serves_on(serve, request_body, status, match):  # noqa: F811
    server, port = serve(engine=ImageEngine(), image_pixels=1000)
    body = {"prompts": [[1, 5, 2]], "n": 1, "params": {}, "images": [[png(4, 4)]], **request_body}
    got, reply = exchange(port, post("/generate", json.dumps(body).encode()))
    assert got == status and re.search(match, reply["error"]), reply
    assert server.engine.calls == []  # refused before the engine
    client = HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT)
    assert client.generate_with_images([[1, 5]], [pictures((4, 4))], [[1, 9, 9, 9]], 1, {}) == [[([7, 0], [-0.5, -0.25])]]


def test_a_text_request_gets_its_logit_bias_as_token_ids(serve):  # noqa: F811
    server, port = serve(engine=ImageEngine())
    HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT).generate([[1, 2]], 2, {"logit_bias": {3: -2.5}})
    assert server.engine.calls[0][4] == {"logit_bias": {3: -2.5}}


def test_an_engine_without_images_refuses_them(serve):  # noqa: F811
    from test_vllm_server_guards import RecordingEngine

    _, port = serve(engine=RecordingEngine())
    with pytest.raises(ServerError, match="does not take images"):
        HTTPEngine(f"http://127.0.0.1:{port}", timeout=WAIT).generate_with_images([[1, 5]], [pictures((4, 4))],
                                                                                   [[1, 5]], 1, {})


def test_the_client_refuses_a_request_over_the_servers_limit_before_sending():
    server = WeightServer(("127.0.0.1", 0), ImageEngine(), limits=ServerLimits(pending_bytes=2**20))
    client = HTTPEngine(f"http://127.0.0.1:{server.server_port}", timeout=WAIT)
    client._limits = {"request_bytes": 1000}  # as build() reads them from /health
    try:
        with pytest.raises(ServerError, match=r"a /generate request of .* MiB \(1 prompts, with their images\) is over "
                                              r"the largest .* --max_request_mb"):
            client.generate_with_images([[1, 5]], [pictures((64, 64))], [[1, 9, 9, 9]], 1, {})
    finally:
        server.server_close()  # never served: the request was not sent
    assert server.engine.calls == []
