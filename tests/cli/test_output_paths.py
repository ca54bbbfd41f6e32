"""Output paths of the commands: special files, directories and read-only files are refused in one line
before any rank starts (these run in-process: tests/conftest.py fails a fast test that starts a process),
and the target is left as it was; a symlink is written through to its regular target, the link kept."""

from __future__ import annotations

import os
import stat

import pytest

from vpp import cli


def _device_node(path) -> str:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # a copy of /dev/full (root, as containers run)
        return "a character device"
    except OSError:
        os.mkfifo(path)
        return "a FIFO"


def _refused(capsys, argv, message):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vpp {argv[0]}: error: "), err
    assert pytest.importorskip("re").search(message, lines[0]), lines[0]
    assert out == ""


def test_save_logits_device_node(tmp_path, capsys):
    node = tmp_path / "full"
    kind = _device_node(node)
    before = os.lstat(node)
    _refused(capsys, ["prefill", "--save-logits", str(node)], f"--save-logits {node}: is {kind}, not a regular file")
    after = os.lstat(node)
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


def test_save_logits_symlink_to_device(tmp_path, capsys):
    node = tmp_path / "full"
    kind = _device_node(node)
    (tmp_path / "link").symlink_to(node)
    _refused(capsys, ["prefill", "--save-logits", str(tmp_path / "link")], f"a symlink to {node}\\): is {kind}")
    assert os.readlink(tmp_path / "link") == str(node)


def test_save_logits_dev_null_as_root_is_refused(capsys):
    _refused(capsys, ["prefill", "--save-logits", "/dev/null"], "--save-logits /dev/null: is a character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_save_logits_directory(tmp_path, capsys):
    _refused(capsys, ["prefill", "--save-logits", str(tmp_path)], "is a directory, not a regular file")


def test_save_logits_read_only_file(tmp_path, capsys):
    f = tmp_path / "logits.safetensors"
    f.write_bytes(b"keep")
    f.chmod(0o444)
    _refused(capsys, ["prefill", "--save-logits", str(f)], r"is read-only \(mode 0444\)")
    assert f.read_bytes() == b"keep" and stat.S_IMODE(os.stat(f).st_mode) == 0o444


def test_save_logits_dangling_symlink(tmp_path, capsys):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    _refused(capsys, ["prefill", "--save-logits", str(tmp_path / "link")], "which does not exist")


def test_trace_dir_with_a_special_file_inside(tmp_path, capsys):
    kind = _device_node(tmp_path / "vpp.png")
    _refused(capsys, ["prefill", "--trace", str(tmp_path)], f"vpp.png: is {kind}")


def test_simulate_trace_dir_with_a_special_file_inside(tmp_path, capsys):
    (tmp_path / "cpp.trace.json").mkdir()
    _refused(capsys, ["simulate", "--pp", "2", "--seq-len", "4096", "--chunk-size", "512", "--trace-dir", str(tmp_path)],
             "cpp.trace.json: is a directory")


def test_tune_and_calibrate_json(tmp_path, capsys):
    _refused(capsys, ["tune", "--json", "/dev/null"], "is a character device")
    _refused(capsys, ["calibrate", "--out", str(tmp_path)], "is a directory")


@pytest.mark.slow
def test_save_logits_symlink_written_through(cpp_prefill):
    """``vpp prefill --save-logits LINK`` of 512 tokens, LINK a symlink to a file (tests/cli/conftest.py)."""
    link, target = cpp_prefill.link, cpp_prefill.target
    assert link.is_symlink() and os.readlink(link) == str(target)
    from safetensors.torch import load_file
    got = load_file(str(target))
    assert got["input_ids"].numel() == 512 and got["logits.cpp"].ndim == 1
    from vpp.safe_write import current_umask
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~current_umask()  # as created, not 0600


def test_save_kv_directory_with_a_special_file_inside(tmp_path, capsys):
    kind = _device_node(tmp_path / "rank-00001.safetensors")
    _refused(capsys, ["generate", "--save-kv", str(tmp_path), "--seq-len", "16", "--max-new-tokens", "2"],
             f"rank-00001.safetensors: is {kind}")
