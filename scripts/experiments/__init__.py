"""Research experiments: ``python -m scripts.experiments.NAME`` from the repository root."""
