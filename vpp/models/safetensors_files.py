"""The files of a model directory, read from their metadata only: the shard index and each safetensors
file's header (tensor names, dtypes, shapes, byte ranges), with one-line errors naming the file.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``) and the tensor
data, with offsets relative to the end of the header. :func:`read_header` reads the first 8 + N
bytes, never the data, and checks that the file is long enough for every tensor it declares (a
truncated download), that the header is JSON of that form (a garbage file) and that each tensor's
byte range matches its dtype and shape.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path


class CheckpointError(ValueError):
    """A model directory whose files vpp cannot load; the message is one line naming the file and
    tensor, what was found and what is supported."""

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# safetensors dtype -> bytes per element
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_MAX_HEADER = 100 << 20  # the safetensors library's own limit on the header size


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a header declares it."""

    file: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


def read_header(path: Path, name: str) -> dict[str, TensorInfo]:
    """Tensor name -> :class:`TensorInfo` of the safetensors file ``path`` (``name``: the file's name
    in the model directory). Raises :class:`CheckpointError` for a file that is not a complete
    safetensors file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, shorter than the 8-byte header "
                                      f"length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise CheckpointError(f"{path}: not a safetensors file, or truncated: it declares a {n}-byte header "
                                      f"but holds {size} bytes")
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({type(exc).__name__}: {exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file: its header is a JSON {type(header).__name__}")
    data = size - 8 - n
    out, end = {}, 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        info, (begin, stop) = _entry(path, tensor, entry, name)
        if stop - begin != info.nbytes:
            raise CheckpointError(f"{path}: {tensor} declares {stop - begin} bytes of data, but {info.dtype} "
                                  f"{list(info.shape)} needs {info.nbytes}")
        out[tensor], end = info, max(end, stop)
    if end > data:
        raise CheckpointError(f"{path}: truncated: its header declares {end} bytes of tensor data, the file holds "
                              f"{data} (re-download it)")
    return out


def _entry(path: Path, tensor: str, entry, name: str) -> tuple[TensorInfo, tuple[int, int]]:
    try:
        dtype, shape, (begin, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
        ok = (dtype in DTYPE_SIZES and all(isinstance(d, int) and d >= 0 for d in shape)
              and isinstance(begin, int) and isinstance(stop, int) and 0 <= begin <= stop)
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path}: not a safetensors file: bad header entry for {tensor!r}: {str(entry)[:120]}")
    return TensorInfo(name, dtype, tuple(shape)), (begin, stop)


def read_index(model_dir: Path) -> dict[str, str]:
    """Tensor name -> file name: from ``model.safetensors.index.json``'s ``weight_map`` when the
    directory has one, else every tensor of ``model.safetensors``. Every file must lie inside the
    directory and exist."""
    index = model_dir / INDEX
    if not index.is_file():
        single = model_dir / SINGLE
        if not single.is_file():
            raise CheckpointError(f"{model_dir}: has neither {SINGLE} nor {INDEX}")
        return {tensor: SINGLE for tensor in read_header(single, SINGLE)}
    try:
        raw = json.loads(index.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{index}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{index}: cannot be read ({type(exc).__name__}: {exc})") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: has no \"weight_map\" object mapping tensor names to files")
    users: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        if not isinstance(file, str) or not _inside(file):
            raise CheckpointError(f"{index}: weight_map[{tensor!r}] = {file!r} points outside the model directory "
                                  f"(refused: files must be relative paths inside {model_dir})")
        users.setdefault(file, []).append(tensor)
    for file, tensors in users.items():
        if not (model_dir / file).is_file():
            raise CheckpointError(f"{index}: names the shard {file} (for {len(tensors)} tensors, e.g. {tensors[0]}) "
                                  f"but {model_dir / file} does not exist")
    return dict(weight_map)


SAMPLE_BYTES = 16  # bytes of each tensor's data in a checkpoint's digest (from the middle of its data)


def checkpoint_digest(model_dir: str | Path) -> str:
    """A short digest of what a model directory holds, independent of where it lies: config.json's bytes
    and, per safetensors file (in name order), its header and :data:`SAMPLE_BYTES` bytes from the middle of
    every tensor's data. Two checkpoints of the same shapes with other weights (a base model and its
    fine-tune) differ in it wherever a tensor changed at its sampled bytes; it reads the headers and one
    page per tensor, not the weights. Files are read once per (path, size, mtime)."""
    model_dir = Path(model_dir)
    files = sorted(set(read_index(model_dir).values()))
    stamps = []
    for name in ["config.json"] + files:
        st = os.stat(model_dir / name)
        stamps.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    return _digest(str(model_dir.resolve()), tuple(stamps))


@functools.lru_cache(maxsize=16)
def _digest(model_dir: str, stamps: tuple) -> str:
    h = hashlib.blake2b(digest_size=12)
    h.update((Path(model_dir) / "config.json").read_bytes())
    for name, *_ in stamps[1:]:
        path = Path(model_dir) / name
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            raw = f.read(n)
            h.update(f"/{name}:{n}:".encode() + raw)
            header = json.loads(raw)
            size = os.fstat(f.fileno()).st_size
            if size <= 8 + n:
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for tensor in sorted(k for k in header if k != "__metadata__"):
                    begin, stop = header[tensor]["data_offsets"]
                    at = 8 + n + max(begin, (begin + stop) // 2 - SAMPLE_BYTES // 2)
                    h.update(data[at:min(at + SAMPLE_BYTES, 8 + n + stop)])
    return h.hexdigest()


def _inside(file: str) -> bool:
    """A relative path that stays inside the directory, read lexically: symbolic links (the Hugging
    Face cache links snapshots to blobs elsewhere) are the user's business, '..' and absolute paths
    in the index are not."""
    if not file or os.path.isabs(file) or file.startswith(("/", "\\")) or ":" in Path(file).parts[0]:
        return False
    norm = os.path.normpath(file)
    return norm != ".." and not norm.startswith(".." + os.sep) and norm != "."


__all__ = [
    "CheckpointError", "DTYPE_SIZES", "FLOAT_DTYPES", "INDEX", "SAMPLE_BYTES", "SINGLE", "TensorInfo",
    "checkpoint_digest", "read_header", "read_index",
]
