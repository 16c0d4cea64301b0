"""The CI tiers run every test once: scripts/test_vllm.sh leaves out the vLLM-named files the main suite runs in
full, and that is only right while none of them needs vLLM (a test there that did would run in neither tier)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDS_VLLM = re.compile(r"^\s*(import vllm\b|from vllm\b)|importorskip\(\s*[\"']vllm[\"']|find_spec\(\s*[\"']vllm[\"']",
                        re.MULTILINE)


def _left_out_of_the_vllm_tier() -> list[str]:
    script = (ROOT / "scripts" / "test_vllm.sh").read_text()
    listed = re.search(r"without_vllm=\(([^)]*)\)", script)
    assert listed, "scripts/test_vllm.sh no longer lists the files it leaves out (without_vllm=(...))"
    return listed.group(1).split()


def test_the_files_the_vllm_tier_leaves_out_never_need_vllm():
    names = _left_out_of_the_vllm_tier()
    assert names, "the list is empty: drop the --ignore loop instead"
    for name in names:
        path = ROOT / "tests" / "generation" / name
        assert path.is_file(), f"scripts/test_vllm.sh leaves out {name}, which does not exist"
        found = NEEDS_VLLM.search(path.read_text())
        assert not found, (f"{name} needs vLLM ({found.group(0).strip()!r}) but scripts/test_vllm.sh leaves it out: "
                           "remove it from without_vllm there")


def test_the_pattern_sees_how_the_vllm_modules_require_it():
    """Every module the tier runs for vLLM itself is caught by the pattern (so a test of that kind added to a
    left-out file would be too)."""
    needing = [p.name for p in (ROOT / "tests" / "generation").glob("test_*.py") if NEEDS_VLLM.search(p.read_text())]
    assert {"test_vllm_engine.py", "test_vllm_lora.py", "test_vllm_server.py"} <= set(needing), needing
