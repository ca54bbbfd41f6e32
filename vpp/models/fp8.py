"""FP8 block quantization (DeepSeek-V3 / Qwen3 FP8 releases): dequantizing any rectangle of a weight.

A quantized weight W [out, in] is stored as Q (float8_e4m3fn, same shape) and S =
``weight_scale_inv`` [ceil(out / bo), ceil(in / bi)] for ``weight_block_size = [bo, bi]``:

    W[r, c] = Q[r, c] * S[r // bo, c // bi]

The last block row / column is partial when bo / bi does not divide out / in. A rank that holds
rows [r0, r1) and columns [c0, c1) of W needs only Q[r0:r1, c0:c1] and the scale blocks that cover
them, S[r0 // bo : ceil(r1 / bo), c0 // bi : ceil(c1 / bi)]; :func:`scale_window` gives that window
and :func:`dequantize` applies it to the rectangle (cropped at both ends, so a slice that starts or
ends inside a block is exact), holding only the float32 result and the row-expanded scales. The product is taken in float32, where it is exact up to one
rounding of the 4-bit-mantissa x 24-bit-mantissa product, and cast to the run dtype by the caller.
"""

from __future__ import annotations

import torch


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] | list[int]) -> tuple[int, int]:
    """The shape ``weight_scale_inv`` must have for a weight of ``shape`` [out, in]."""
    (out, inp), (bo, bi) = shape, block
    return -(-out // bo), -(-inp // bi)


def scale_window(start: int, end: int, block: int) -> tuple[int, int]:
    """[first, last) scale blocks along one dim that cover elements [start, end)."""
    if end <= start:
        return start // block, start // block
    return start // block, -(-end // block)


def dequantize(q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] | list[int],
               origin: tuple[int, int]) -> torch.Tensor:
    """Float32 values of the rectangle ``q`` of a block-quantized weight.

    ``q`` holds rows [r0, r0 + h) and columns [c0, c0 + w) of the full weight, ``origin = (r0, c0)``;
    ``scales`` is the :func:`scale_window` of those rows and columns in the full scale grid."""
    (bo, bi), (r0, c0) = block, origin
    h, w = q.shape
    expected = (scale_window(r0, r0 + h, bo)[1] - r0 // bo, scale_window(c0, c0 + w, bi)[1] - c0 // bi)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scale window {tuple(scales.shape)} does not cover rows [{r0}, {r0 + h}) and columns "
                         f"[{c0}, {c0 + w}) with blocks [{bo}, {bi}] (expected {expected})")
    rows = scales.float().repeat_interleave(bo, dim=0)[r0 % bo: r0 % bo + h]  # [h, column blocks]
    out = q.float()
    start = 0
    for j in range(rows.shape[1]):  # column block by column block: no weight-sized scale tensor
        width = min(bi - (c0 % bi if j == 0 else 0), w - start)
        out[:, start:start + width].mul_(rows[:, j:j + 1])
        start += width
    return out


__all__ = ["dequantize", "scale_shape", "scale_window"]
