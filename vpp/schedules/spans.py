"""A span: one rank busy, blocked or idle over an interval (the unit of every trace; see :mod:`.trace`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

KINDS = ("compute", "send", "recv", "idle", "wait", "transfer")


@dataclass(frozen=True)
class Span:
    rank: int
    kind: str
    start: float
    end: float
    stage: int | None = None
    request: int | None = None
    chunk: int | None = None
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"span kind {self.kind!r}; expected one of {KINDS}")

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def key(self) -> tuple:
        return (self.stage, self.request, self.chunk)

    @property
    def label(self) -> str:
        if self.stage is None:
            return self.kind
        return f"s{self.stage}/C{self.chunk}" + (f"/R{self.request}" if self.request else "")

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


__all__ = ["KINDS", "Span"]
