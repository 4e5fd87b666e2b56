"""benchmarks/kernel_ab.py: two builds of the kernels under their own operator namespaces in one process."""

import pytest
import torch

from benchmarks import kernel_ab


def test_renamed_moves_every_registration_to_the_new_namespace():
    sources = kernel_ab.sources_in_tree()
    out = kernel_ab.renamed(sources, "sarathi_ab_x")
    assert out.keys() == sources.keys()
    registering = [name for name, text in sources.items() if b"TORCH_LIBRARY" in text]
    assert registering  # the tree registers its operators somewhere
    for name, text in out.items():
        assert b"sarathi_kernels" not in text, name
        if name in registering:
            assert b"(sarathi_ab_x," in text
    # the identifier as a whole word, wherever it stands (the C++ namespace too), and nothing else
    source = (
        b"namespace sarathi_kernels {\nTORCH_LIBRARY(sarathi_kernels, lib) {}\n"
        b'lib.def("f(__torch__.torch.classes.sarathi_kernels.C c) -> ()"); sarathi_kernels_x'
    )
    assert kernel_ab.renamed({"a.cpp": source}, "ns")["a.cpp"] == (
        b'namespace ns {\nTORCH_LIBRARY(ns, lib) {}\nlib.def("f(__torch__.torch.classes.ns.C c) -> ()"); '
        b"sarathi_kernels_x"
    )


def test_sources_at_a_revision_are_the_committed_files():
    at_head = kernel_ab.sources_at("HEAD")
    tree = kernel_ab.sources_in_tree()
    assert at_head and set(at_head) <= set(tree)  # the tree may hold new, uncommitted files
    assert all(name.endswith((".cpp", ".h")) for name in at_head)


def test_serving_swaps_the_namespace_the_kernels_module_calls_and_restores_it():
    ours = torch.ops.sarathi_kernels
    with kernel_ab.serving("aten"):
        assert torch.ops.sarathi_kernels is torch.ops.aten
    assert torch.ops.sarathi_kernels is ours
    with pytest.raises(RuntimeError), kernel_ab.serving("aten"):
        raise RuntimeError("restored on the way out too")
    assert torch.ops.sarathi_kernels is ours


def test_case_names():
    with pytest.raises(ValueError, match="unknown case"):
        kernel_ab.case_fn("prefil16", None, None, None)


@pytest.mark.slow
def test_two_builds_of_the_same_sources_give_the_same_outputs():
    """A/A: both builds compiled (about a minute each) and run through sarathi.model.kernels."""
    from sarathi.model import kernels
    from sarathi.model.quant_path_tuning import random_weight

    if not kernels.portable_available():
        pytest.skip("our kernels do not run here")
    sources = kernel_ab.sources_in_tree()
    a, b = kernel_ab.build(sources, "a"), kernel_ab.build(sources, "b")
    w = random_weight("Q4_K", 48, 512)
    x = torch.randn(3, 512)
    outs = []
    for ns in (a, b):
        with kernel_ab.serving(ns):
            outs.append(kernels.quant_linear(x, w))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], kernels.quant_linear(x, w))
