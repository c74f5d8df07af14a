"""ringpg's benchmark instrument: ``bench`` (sweep), ``compare`` (torchrun job), ``netns`` (emulated cluster).

Run from the repository root, e.g. ``python -m benchmarks.bench --check``; see
``benchmarks/README.md``.
"""
