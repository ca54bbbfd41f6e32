"""vpp.safe_write: one test per kind of target. Nothing here starts a process."""

import os
import stat

import pytest

from vpp.safe_write import OutputPathError, atomic_open, check_output_dir, check_output_file, current_umask, write_bytes


def _device_node(path):
    """A character device (a copy of /dev/full, 1:7) where this process may create one (root), else a FIFO:
    both are special files a write must never replace."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        return "a character device"
    except (PermissionError, OSError):
        os.mkfifo(path)
        return "a FIFO"


def test_device_node_refused_untouched(tmp_path):
    node = tmp_path / "node"
    kind = _device_node(str(node))
    before = os.lstat(node)
    with pytest.raises(OutputPathError, match=f"is {kind}, not a regular file"):
        write_bytes(node, b"logits")
    after = os.lstat(node)
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    assert sorted(os.listdir(tmp_path)) == ["node"]  # no temporary file left behind


def test_fifo_and_socket_refused(tmp_path):
    import socket
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OutputPathError, match="a FIFO"):
        check_output_file(tmp_path / "fifo", "--out")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        with pytest.raises(OutputPathError, match="a socket"):
            check_output_file(tmp_path / "sock")
    finally:
        sock.close()


def test_directory_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputPathError, match=r"--save-logits .*d: is a directory"):
        write_bytes(tmp_path / "d", b"x", option="--save-logits")
    assert (tmp_path / "d").is_dir() and os.listdir(tmp_path / "d") == []


def test_read_only_file_refused_even_for_root(tmp_path):
    f = tmp_path / "ro"
    f.write_bytes(b"keep")
    f.chmod(0o444)
    with pytest.raises(OutputPathError, match=r"read-only \(mode 0444\)"):
        write_bytes(f, b"new")
    assert f.read_bytes() == b"keep"


def test_symlink_written_through_link_kept(tmp_path):
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    assert write_bytes(link, b"new") == str(target)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640  # the file keeps its mode when replaced


def test_symlink_to_device_or_dangling_refused(tmp_path):
    node = tmp_path / "node"
    kind = _device_node(str(node))
    (tmp_path / "to_node").symlink_to(node)
    with pytest.raises(OutputPathError, match=f"a symlink to .*node.*is {kind}"):
        write_bytes(tmp_path / "to_node", b"x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputPathError, match="which does not exist"):
        write_bytes(tmp_path / "dangling", b"x")
    assert os.path.islink(tmp_path / "dangling") and not os.path.exists(tmp_path / "nowhere")


def test_regular_file_replaced_whole(tmp_path):
    f = tmp_path / "out.json"
    f.write_text("old")
    ino = os.stat(f).st_ino
    with pytest.raises(RuntimeError):
        with atomic_open(f, "w") as h:
            h.write("half")
            raise RuntimeError("failure mid-write")
    assert f.read_text() == "old" and os.stat(f).st_ino == ino  # untouched on failure
    with atomic_open(f, "w") as h:
        h.write("new")
    assert f.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_new_file_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        write_bytes(tmp_path / "a", b"x")
        os.umask(0o002)
        write_bytes(tmp_path / "b", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o664


def test_missing_folder_and_dirs(tmp_path):
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_file(tmp_path / "no" / "f")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "file" / "sub")
    assert check_output_dir(tmp_path / "new" / "sub") == str(tmp_path / "new" / "sub")


def test_plan_trace_writers_refuse_special_files(tmp_path):
    from vpp.schedules.trace import Trace
    trace = Trace(1, (), {})
    kind = _device_node(str(tmp_path / "node"))
    with pytest.raises(OutputPathError, match=kind):
        trace.save(tmp_path / "node")
    with pytest.raises(OutputPathError, match=kind):
        trace.to_chrome(tmp_path / "node")
    trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json").num_ranks == 1
