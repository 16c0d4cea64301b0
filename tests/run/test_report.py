"""`rloo report`: the page from a real run, and the page in headless Chromium where one is installed."""

import base64
import json
import re
import shutil
import subprocess

import pytest

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_dir(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=2,
                      max_completion_length=4, max_steps=4, logging_steps=1, save_steps=0, eval_steps=2,
                      log_completions=True, num_completions_to_print=2, seed=0)
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset,
                eval_dataset=digit_dataset.select(range(4)), processing_class=tokenizer).train()
    return tmp_path / "run"


def test_report_is_one_page_with_inline_plots_config_and_completions(run_dir, capsys):
    pytest.importorskip("matplotlib", reason="rloo report needs matplotlib (pip install matplotlib)")
    main(["report", str(run_dir)])
    page = (run_dir / "report.html").read_text()
    assert str((run_dir / "report.html").resolve()) in capsys.readouterr().out
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    titles = [title for title, _ in images]
    for expected in ("Reward (band: mean within-group std)", "KL to the reference", "Entropy",
                     "Completion length (band: min to max)", "Learning rate",
                     "Grad norm (before clipping)", "eval reward"):
        assert expected in titles, expected
    assert "Clip fractions (0)" in page  # one pass per batch: 0 by construction, named instead of drawn
    assert all(base64.b64decode(data).startswith(PNG) for _, data in images)
    assert "src=\"http" not in page and "<script" not in page  # self-contained: nothing fetched
    assert "<th>num_generations</th><td>2</td>" in page
    steps = sorted({json.loads(line)["step"] for line in (run_dir / "completions.jsonl").read_text().splitlines()})
    assert steps == [1, 2, 3, 4] and all(f"<h3>step {s}</h3>" in page for s in steps)


def test_report_of_a_directory_without_a_run_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    assert "metrics.jsonl is missing" in capsys.readouterr().err


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(BROWSER is None, reason="no headless browser installed (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    pytest.importorskip("matplotlib", reason="rloo report needs matplotlib (pip install matplotlib)")
    main(["report", str(run_dir)])
    page = (run_dir / "report.html").read_text()
    # A copy that writes how many images decoded into the DOM, for --dump-dom to read back.
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load', () => { const i = "
                                  "[...document.images]; document.body.setAttribute('data-loaded', "
                                  "i.filter(x => x.complete && x.naturalWidth > 0).length + '/' + i.length); });"
                                  "</script></body>"))
    flags = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    loaded = re.search(r'data-loaded="(\d+)/(\d+)"', dom.stdout)
    assert loaded, dom.stderr[-2000:]
    assert int(loaded.group(1)) == int(loaded.group(2)) >= 9
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,2400", (run_dir / "report.html").as_uri()],
                   capture_output=True, text=True, timeout=120)
    from matplotlib.image import imread

    pixels = imread(str(shot))  # (H, W, channels) floats in [0, 1]
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1280
    colours = {tuple(p) for p in (pixels[::8, ::8, :3] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(colours) > 50  # plots, text and tables, not a blank or single-colour page
    assert pixels[..., :3].std() > 0.05
