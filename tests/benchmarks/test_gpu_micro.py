"""benchmarks/gpu/gpu_micro.py: its dry run (--cpu-tiny) runs every piece on CPU at tiny sizes, so the attribution
script of issue #46 cannot rot between GPU leases."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_times_every_piece(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_micro.py"), "--cpu-tiny", "--out",
                             str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_micro.json").read_text())
    pieces = data["pieces"]
    assert set(pieces) == {"head", "decoder", "no_grad", "decode", "profile", "compile"}
    for name, entry in pieces.items():
        assert entry["status"] == "ok", (name, entry.get("traceback"))
    variants = {"head": ["before_46", "new", "new_old_tiles", "reference_before_46", "reference_new_bf16_weight"],
                "decoder": ["lean_on", "lean_off"],
                "no_grad": ["policy_whole_rows", "policy_grouped", "reference_bf16_whole_rows", "reference_bf16_grouped"],
                "decode": ["eager_fp32_model", "eager_bf16_copy", "static_bf16_copy"]}
    for piece, names in variants.items():
        for name in names:
            assert pieces[piece][name]["ms_median"] > 0, (piece, name)
    assert pieces["decode"]["eager_fp32_model"]["key_dtype"] == "float32"
    assert pieces["decode"]["static_bf16_copy"]["key_dtype"] == "bfloat16"
    assert pieces["decode"]["static_bf16_copy"]["step_kind"] == "StaticStep"
    assert pieces["decode"]["eager_bf16_copy"]["step_kind"] == "eager"
    assert pieces["profile"]["top"] and (tmp_path / "profile_training_micro_batch.txt").exists()
    assert "| head | new |" in (tmp_path / "gpu_micro.md").read_text()
