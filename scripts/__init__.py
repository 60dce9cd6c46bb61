"""Scripts beside the library, run as modules from the repository root (``python -m scripts.X``).

``bench/`` measures speed and memory, each figure as a ratio to a baseline of the same run;
``experiments/`` holds research studies (replicas, probes, ablations); ``workloads.py`` builds
the models and batches several of them share.
"""
