import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine OpenMP
    barriers make them 10-100x slower; the spawned ranks run one thread each as well."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_cases(tmp_path_factory):
    """model_type -> Case: a tiny random transformers model saved to disk, and its logits."""
    from tests.models.hf_tiny import MODEL_TYPES, make_case  # transformers: only in this process
    root = tmp_path_factory.mktemp("hf")
    return {t: make_case(t, root) for t in MODEL_TYPES}


@pytest.fixture(scope="session")
def fp8_cases(tmp_path_factory):
    """model_type -> FP8Case: a tiny FP8 block-quantized checkpoint in the official layout, the same
    model dequantized, and transformers' logits on the dequantized weights (tests/models/fp8_tiny.py)."""
    from tests.models.fp8_tiny import make_fp8_case
    from tests.models.hf_tiny import MODEL_TYPES
    root = tmp_path_factory.mktemp("fp8")
    return {t: make_fp8_case(t, root) for t in MODEL_TYPES}


@pytest.fixture(scope="session")
def tp2_results(hf_cases, fp8_cases, worlds):
    """Every TP = 2 check, from one case on the session's world of two ranks (see tests/models/tp2.py)."""
    from tests.models.tp2 import run_checks
    results = worlds.run(2, run_checks, list(hf_cases.values()), list(fp8_cases.values()), timeout=300)
    assert results[0].keys() == results[1].keys()
    return results
