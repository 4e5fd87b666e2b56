"""sarathi: an LLM serving engine with chunked prefills and stall-free batching (Sarathi-Serve)."""

from sarathi.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "build_engine"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy so that the pure-Python parts (scheduler, block manager) import without torch.
    if name == "LLM":
        from sarathi.entrypoints.llm import LLM

        return LLM
    if name == "LLMEngine":
        from sarathi.engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "build_engine":
        from sarathi.entrypoints.build import build_engine

        return build_engine
    raise AttributeError(f"module 'sarathi' has no attribute {name!r}")
