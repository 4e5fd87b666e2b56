"""The project's measurements, one module each, run from the repository root as ``python -m benchmarks.NAME``
(``make demo`` is ``python -m benchmarks.demo``, ``make bench`` is ``python -m benchmarks.model_forward``).
Results are saved under ``benchmarks/results/`` with the machine and the commit (``benchmarks.record``)."""
