"""allocator.return_large_buffers_to_os: large freed buffers stay on mmap (given back), not glibc's heap.

glibc raises its mmap threshold past the size of the first mmapped block freed, so afterwards 1 MB
blocks come from the heap; with the threshold fixed they are still mmapped. mallinfo2's `hblks`
counts the mmapped blocks in use, which tells the two apart without timing or RSS readings."""

import ctypes
import os
import subprocess
import sys

import pytest

from rloo.run import allocator
from rloo.run.allocator import return_large_buffers_to_os

ALLOCATOR = allocator.__file__

# The probe loads allocator.py alone, not the rloo package (whose import costs seconds of CPU in each process).
PROBE = """
import ctypes, importlib.util, os, sys
import torch
spec = importlib.util.spec_from_file_location("allocator", sys.argv[1])
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
return_large_buffers_to_os = allocator.return_large_buffers_to_os

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
print("set", return_large_buffers_to_os())
first = torch.empty(8 * 151_936)  # one decode step's (rows, V) fp32 buffer, 4.9 MB
del first                         # freed: glibc's default raises its threshold past 4.9 MB
before = mallinfo2().hblks
held = [torch.empty(1 << 18) for _ in range(8)]  # eight 1 MB blocks
print("mmapped", mallinfo2().hblks - before)
"""


def _probe(**env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "RLOO_KEEP_MALLOC_SETTINGS")}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", PROBE, ALLOCATOR], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    return lines["set"] == "True", int(lines["mmapped"])


def _has_glibc_mallinfo2():
    try:
        ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return False
    return sys.platform == "linux"


@pytest.mark.skipif(not _has_glibc_mallinfo2(), reason="needs glibc >= 2.33 (mallopt and mallinfo2)")
def test_large_blocks_stay_mmapped_once_the_threshold_is_fixed():
    assert _probe() == (True, 8)  # every 1 MB block mmapped, so each goes back to the system when freed
    set_here, mmapped = _probe(RLOO_KEEP_MALLOC_SETTINGS="1")  # glibc's default: the heap takes them
    assert not set_here and mmapped == 0


def test_a_users_own_malloc_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert return_large_buffers_to_os() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("RLOO_KEEP_MALLOC_SETTINGS", "1")
    assert return_large_buffers_to_os() is False
