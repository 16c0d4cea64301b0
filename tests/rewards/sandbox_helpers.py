"""What the sandbox tests share: finding the program's processes from the host's side."""

import os


def processes_with(token: str) -> list[int]:
    """Pids (as the host sees them) whose command line holds `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                found += [int(pid)] if token.encode() in cmdline.read() else []
        except OSError:
            pass
    return found
