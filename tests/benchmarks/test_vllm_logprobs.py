"""benchmarks.vllm_logprobs without vLLM: its arguments, its variants (smaller DeepSeek-V3s that vpp and
transformers read alike) and its comparison arithmetic."""

import pytest
import torch

from benchmarks import vllm_logprobs


@pytest.mark.parametrize("argv", [["--variants", "llama"], ["--lengths", "0"], ["--lengths", "8k"],
                                  ["--lengths", "4096"], ["--variants", ""], ["--vllm-rope", "fused"],
                                  ["--vllm-rope", ""]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vllm_logprobs.parse_args(argv)
    assert exc.value.code == 2 and "vllm_logprobs" in capsys.readouterr().err


def test_variants_change_only_what_they_say():
    from benchmarks.vs_vllm import DEEPSEEK
    from vpp.models import model_config
    assert vllm_logprobs.config("as-is") == DEEPSEEK
    one = model_config(vllm_logprobs.config("1-layer"))
    assert one["num_hidden_layers"] == 1 and one["mlp_layer_types"] == ["dense"]
    assert model_config(vllm_logprobs.config("all-dense"))["mlp_layer_types"] == ["dense"] * 4


def test_the_comparison_is_over_vllms_tokens():
    ref = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64), -1)
    vpp = ref.clone()
    vpp[0] += 0.5  # not among vLLM's tokens: not counted
    row = vllm_logprobs.compare({3: float(ref[3]) - 0.25, 2: float(ref[2])}, vpp, ref)
    assert row["vllm"] == pytest.approx(0.25) and row["vpp"] == 0.0 and row["argmax"] == (3, 3, 3)


def test_vllm_runs_both_ways_by_default_and_the_op_can_be_turned_off():
    assert vllm_logprobs.parse_args([]).vllm_rope == ["op", "native"]
    assert vllm_logprobs.parse_args(["--vllm-rope", "native"]).vllm_rope == ["native"]
    assert '"custom_ops": ["all", "-rotary_embedding"]' in vllm_logprobs.DRIVER
    assert "forward_cpu" in vllm_logprobs.OP_CHECK and "forward_native" in vllm_logprobs.OP_CHECK
