"""Writes that are complete or absent: quantize into places it cannot write, stopped by SIGTERM or
SIGINT, partials left by a killed run; the OpenBLAS shim's mode; small messages that were wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, invoke_cli, start_held

import checkpoints
from mlxinfer.errors import MlxinferError


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


# ---------------------------------------------------------------------------------------------- unwritable
def test_quantize_into_places_it_cannot_write(checkpoint_dir, tmp_path):
    """Was: a raw OSError traceback from quant/writer.py."""
    src = str(checkpoint_dir("llama"))
    (tmp_path / "file").write_text("x")
    cases = [
        ("/proc/mlxinfer-no-such-process/out", "No such file or directory"),
        (str(tmp_path / "file" / "out"), "is a file, not a directory"),
    ]
    for out, fragment in cases:
        assert_one_line_error(invoke_cli("quantize", src, out), "cannot write OUT", fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_quantize_of_weights_with_inf_writes_nothing(checkpoint_dir, tmp_path):
    """Was: exit 0 and a model directory whose every forward pass gave NaN (with --report: exit 2, and the
    directory left). Now one line naming the tensor, before anything is written."""
    bad = checkpoints.corrupt_copy(checkpoint_dir("llama"), tmp_path / "bad")
    for extra in ([], ["--report"]):
        result = invoke_cli("quantize", str(bad), str(tmp_path / "out"), *extra)
        assert_one_line_error(result, "model.layers.1.mlp.up_proj.weight holds NaN or inf")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_quantize_into_a_read_only_directory(checkpoint_dir, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(locked / "out"))
    assert_one_line_error(result, "cannot write OUT", "Permission denied")


def test_refused_write_is_one_error_and_leaves_nothing(checkpoint_dir, tmp_path, monkeypatch):
    """What a read-only directory does (as root, which the one above cannot show): EACCES on the temp dir."""
    import tempfile

    from mlxinfer_quant import quantize

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(MlxinferError, match="cannot write out .*Permission denied"):
        quantize(checkpoint_dir("llama"), tmp_path / "new" / "out")
    assert list(tmp_path.iterdir()) == []  # the parent it created for OUT is gone too


# ---------------------------------------------------------------------------------------------- signals
@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_stopped_quantize_leaves_no_partial(checkpoint_dir, tmp_path, sig, code):
    """Was: SIGTERM (unlike SIGINT) left a hidden .OUT.partial-* directory behind. The signal arrives at a
    known point, the latest one: every file written into the partial, just before it is renamed onto OUT."""
    out = tmp_path / "out"
    proc = start_held("quantize", str(checkpoint_dir("llama")), str(out), "--bits", "4", at="rename", target=out)
    try:
        (partial,) = _leftovers(tmp_path, "out")  # held inside the write: the partial is there, whole
        assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / partial).iterdir()}
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_stale_partials_are_removed_by_the_next_run(checkpoint_dir, tmp_path):
    """A partial whose process is gone (or whose id now belongs to a newer process) is removed by the
    next write of the same OUT; one whose process still runs is left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".out.partial-{gone.pid}-abc"
    old = tmp_path / f".out.old-{gone.pid}-def"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        alive = tmp_path / f".out.partial-{sleeper.pid}-ghi"
        reused = tmp_path / f".out.partial-{sleeper.pid}-jkl"
        for d in (dead, old, alive, reused):
            (d / "x").mkdir(parents=True)
        day_ago = time.time() - 86400
        os.utime(reused, (day_ago, day_ago))  # made long before the process that now has its id started
        assert invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "out")).returncode == 0
        assert _leftovers(tmp_path, "out") == [alive.name]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_staged_writes_are_whole_or_absent(tmp_path):
    """atomic.staged_dir / staged_file, which quantize, the kernel builds and a sweep's merge stand on:
    a failure inside leaves the old contents and no partial; success swaps in the new with its mode."""
    from mlxinfer import atomic

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic.staged_dir(out, replace=True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("stopped")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "old.txt").exists()
    with atomic.staged_dir(out, mode=0o750, replace=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"] and out.stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    taken = tmp_path / "taken"
    (taken / "x").mkdir(parents=True)
    with pytest.raises(OSError):  # without replace, a non-empty target is not overwritten
        with atomic.staged_dir(taken) as tmp:
            (tmp / "y").write_text("y")
    assert [p.name for p in taken.iterdir()] == ["x"] and _leftovers(tmp_path, "taken") == []

    f = tmp_path / "f.jsonl"
    f.write_text("before\n")
    with pytest.raises(RuntimeError):
        with atomic.staged_file(f) as tmp:
            tmp.write_text("half")
            raise RuntimeError("stopped")
    assert f.read_text() == "before\n" and _leftovers(tmp_path, "f.jsonl") == []
    with atomic.staged_file(f) as tmp:
        tmp.write_text("after\n")
    assert f.read_text() == "after\n" and f.stat().st_mode & 0o777 == 0o666 & ~os.umask(os.umask(0o22))


# ---------------------------------------------------------------------------------------------- the shim
def test_openblas_shim_is_readable_by_other_users(tmp_path):
    """Was: mode 0711 (mkstemp's 0600 plus the linker's +x), so other users fell back to the slow BLAS."""
    from mlxinfer.cpu import blas, openblas_shim

    if not sys.platform.startswith("linux") or openblas_shim.openblas_library() is None:
        pytest.skip("scipy-openblas32 is not installed")
    out = tmp_path / blas.SHIM_NAME
    stale = tmp_path / f".{blas.SHIM_NAME}.partial-999999999-x.so"
    stale.write_bytes(b"left by a killed build")
    openblas_shim.build(out=str(out))
    assert out.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == [blas.SHIM_NAME]


# ---------------------------------------------------------------------------------------------- small things
def test_quality_text_that_is_not_utf8(checkpoint_dir, tmp_path):
    """Was: a UnicodeDecodeError traceback."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00 not text")
    path = str(checkpoint_dir("llama"))
    assert_one_line_error(invoke_cli("quality", path, path, "--text", str(bad)), "--text", "not UTF-8")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gen-tokens", "0"], "error: --gen-tokens must be at least 2, got 0\n"),
        (["--repeats", "0"], "error: --repeats must be at least 1, got 0\n"),
        (["--prompt-tokens", "a,b"], "error: --prompt-tokens takes whole numbers like 32,64,128; got 'a'\n"),
    ],
)
def test_bench_errors_are_exactly_one_line(checkpoint_dir, args, message):
    """Was: range errors began with a blank line; --prompt-tokens a,b asked for numbers like 0.5."""
    result = invoke_cli("bench", "-m", str(checkpoint_dir("llama")), *args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message)


def test_a_staged_file_refuses_a_directory_by_name(tmp_path):
    """Was, after the device check: a directory was refused as 'a device, a pipe or a socket'."""
    from mlxinfer import atomic

    with pytest.raises(IsADirectoryError, match="it is a directory"):
        with atomic.staged_file(tmp_path):
            pass
