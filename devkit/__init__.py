"""Helpers the tests (``tests/harness``) and the benchmarks (``benchmarks``) both import,
neither owning them:

* ``launch``: free ports, ranks that die with their launcher, starting local ranks,
  torchrun's environment;
* ``machine``: the facts every run prints first (CPU, memory, torch, load), threads per
  rank, resident memory;
* ``groups``: what a live group says about itself (its transport, algorithm, copy
  mode) and the global rank a rooted op names;
* ``settings``: ringpg's expert setting (``RINGPG_TUNING``), set and read back.

Run from the repository root (``tests/conftest.py`` puts it on ``sys.path``).
"""
