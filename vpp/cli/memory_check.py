"""Before any rank starts: the prompt fits the model's positions, and the planned memory per rank
(:mod:`vpp.perf.memory_plan`) fits what the ranks can have. Either problem is one line, exit 2."""

from __future__ import annotations

from vpp.cli.args import UsageError

MIB = 2 ** 20


def check_positions(config: dict, tokens: int, what: str) -> None:
    """``tokens`` (a prompt, plus the tokens to decode) within the model's ``max_position_embeddings``."""
    limit = config.get("max_position_embeddings")
    if limit is not None and tokens > int(limit):
        raise UsageError(f"{what} is {tokens} tokens, more than the model's {limit} positions "
                         f"(max_position_embeddings in its config; a model directory goes further with a larger one "
                         f"and a matching rope_scaling, e.g. YaRN)")


def plan_ranks(model, layout, *, tp: int, tokens: int, chunk: int, device: str = "auto", dtype=None, cp: int = 1):
    """The :class:`~vpp.perf.memory_plan.RankMemoryPlan` of every pipeline rank of ``layout`` (with ``cp``:
    of each of its context-parallel ranks, which are alike)."""
    from vpp.perf.arch import Arch
    from vpp.perf.memory_plan import CPU_WORKSPACE, DEVICE_WORKSPACE_SHARE, plan_memory
    dtype = dtype or model.dtype
    card = _card_bytes(device)
    pp = layout.num_ranks
    rank_layers = [[i for s in layout.stages_of(r) for i in range(*layout.stage_layers[s])] for r in range(pp)]
    try:
        arch = Arch.from_config(model.config)
    except (KeyError, TypeError, ValueError):
        return None  # a model the cost model does not describe (the toy model): no plan
    return plan_memory(arch, rank_layers, tp=tp, dtype_bytes=dtype.itemsize, tokens=tokens, chunk=chunk,
                       first_rank=layout.rank_of(0), last_rank=layout.rank_of(layout.last_stage),
                       weights=_meta_weights(model, layout, tp, dtype),
                       workspace_bytes=card // DEVICE_WORKSPACE_SHARE if card else CPU_WORKSPACE,
                       runtime=0 if card else _rss(), cp=cp)


def check_memory(model, layouts: dict, *, tp: int, tokens: int, chunk: int, device: str = "auto",
                 option: str = "", cp: int = 1) -> dict:
    """Plans per schedule; a :class:`UsageError` with the figures when one does not fit."""
    from vpp.perf.memory_plan import shortfall
    plans = {}
    for name, layout in layouts.items():
        plan = plan_ranks(model, layout, tp=tp, tokens=tokens, chunk=chunk, device=device, cp=cp)
        if plan is None:
            continue
        plans[name] = plan
        card = _card_bytes(device)
        ranks = [p for p in plan for _ in range(tp * cp)]  # every TP (and CP) rank of a stage holds the same share
        if card:
            problem = shortfall(ranks, card, shared=False)
            where = f"{_kind(device)} memory per rank"
        else:
            problem = shortfall(ranks, cpu_available(), shared=True)
            where = "this machine's memory (MemAvailable, and the cgroup's limit), shared by the ranks"
        if problem:
            raise UsageError(f"{name}: {tokens} tokens in chunks of {chunk}{option} do not fit {where}: {problem}")
    return plans


def cpu_available() -> int:
    """Bytes the ranks may use: the machine's MemAvailable, capped by this cgroup's limit less its usage."""
    avail = _meminfo("MemAvailable") or _meminfo("MemTotal") or 1 << 62
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and limit < 1 << 60:
            avail = min(avail, limit - (usage or 0))
            break
    return max(0, avail)


def _meta_weights(model, layout, tp: int, dtype) -> list[int] | None:
    """Parameter bytes of each pipeline rank's stages (TP rank 0), built on the meta device."""
    try:
        from vpp.models.build import build_stage
        from vpp.parallel.grid import GridSizes
        from vpp.parallel.groups import ParallelGroups
        sizes = GridSizes(tp * layout.num_ranks, tp=tp, pp=layout.num_ranks)
        out: dict[int, int] = {}
        for g in range(sizes.world_size):
            groups = ParallelGroups.virtual(sizes, g)
            if groups.tp.rank or groups.dp.rank:
                continue
            r = groups.pp.rank
            stages = [build_stage(model.config, layout.stage_layers[s], groups, device="meta", dtype=dtype)
                      for s in layout.stages_of(r)]
            out[r] = sum(p.numel() * p.element_size() for st in stages for p in st.parameters())
        return [out[r] for r in range(layout.num_ranks)]
    except Exception:  # noqa: BLE001 -- the cost model's formula is the fallback
        return None


def _card_bytes(device: str) -> int:
    """Memory of one accelerator card, or 0 for CPU ranks."""
    from vpp.parallel.device import get_accelerator
    try:
        acc = get_accelerator(None if device == "auto" else device)
    except (RuntimeError, ValueError):
        return 0
    if acc.kind == "cpu":
        return 0
    import torch
    return int(getattr(torch, acc.kind).get_device_properties(0).total_memory)


def _kind(device: str) -> str:
    return "the accelerator's" if device == "auto" else f"the {device} card's"


def _rss() -> int:
    """This process's resident set: a rank imports the same interpreter and libraries."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


__all__ = ["MIB", "check_memory", "check_positions", "cpu_available", "plan_ranks"]
