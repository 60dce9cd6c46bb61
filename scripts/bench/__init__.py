"""Speed and memory benchmarks: ``python -m scripts.bench.NAME`` from the repository root."""
