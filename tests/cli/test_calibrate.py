"""`vpp calibrate` on a tiny model, small enough for a test (timings are not asserted, only shapes)."""

import json

from vpp.cli import main
from vpp.perf.arch import Arch
from vpp.cli.calibration import chunk_features, fit_stage
from vpp.perf.hardware import CPU, get_device
from vpp.perf.ops import Parallel

from tests.perf.archs import TINY_GQA


def test_fit_stage_recovers_constants():
    arch, par = Arch.from_config(TINY_GQA), Parallel(tp=1, act_bytes=4, weight_bytes=4, kv_bytes=4)
    dev = CPU.replace(peak_flops=1e10, mem_bw=1e10, eff_matmul=1.0, eff_mem=1.0)
    sizes, prefixes = [64] * 6, [64 * k for k in range(6)]
    truth = [a + b / 0.4 + c * 3e-5 for a, b, c in (chunk_features(arch, par, dev, n, p) for n, p in zip(sizes, prefixes))]
    eff, overhead = fit_stage(arch, par, dev, sizes, prefixes, truth)
    assert abs(eff - 0.4) < 1e-6 and abs(overhead - 3e-5) < 1e-9


def test_calibrate_cli_writes_a_loadable_preset(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "tiny-qwen", "--tokens", "256", "--chunk", "128", "--runs", "1",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["validation"]["measured"]) == 2 and data["device"]["peak_flops"] > 0
    dev = get_device("cpu", str(out))
    assert dev.peak_flops == data["device"]["peak_flops"] and dev.eff_attn == data["device"]["eff_attn"]
    assert "cost model vs measured" in capsys.readouterr().out
