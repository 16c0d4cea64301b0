"""A folder made read-only or a full disk outside a checkpoint (metrics.jsonl, completions.jsonl; issue #48): the CLI
ends with one line naming the errno and the path and saying how to go on, exit status 2, not a traceback."""

import errno

import pytest

import rloo.cli as cli


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_a_storage_error_is_one_line_with_the_errno_and_the_path(code, monkeypatch, capsys):
    def train(argv):
        raise OSError(code, __import__("os").strerror(code), "/runs/x/metrics.jsonl")

    monkeypatch.setattr(cli, "run_train", train)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rloo: error: [Errno {code}] ") and "'/runs/x/metrics.jsonl'" in err
    assert "--resume_from_checkpoint latest" in err and "Traceback" not in err


def test_other_os_errors_keep_their_traceback(monkeypatch):
    def train(argv):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(cli, "run_train", train)
    with pytest.raises(OSError, match="Bad file descriptor"):
        cli.main(["train"])
