"""The one registry of what gloo lacks, for runs that substitute gloo for ringpg.

Only relevant when ``RINGPG_TEST_BACKEND=gloo`` makes gloo the backend under test
(to validate the tests themselves): checks of these features are then skipped;
against ringpg they always run.  Features are named by short strings; ask with
:func:`known_gap`.
"""

from __future__ import annotations

import torch

from .backend import REFERENCE_BACKEND

# Features gloo lacks, checked in torch 2.15.
GLOO_GAPS: frozenset[str] = frozenset(
    {
        "AVG on integer dtypes",  # raises "result type Float can't be cast"
        "future of reduce_scatter_tensor",  # Work::getFuture not implemented; is_completed() stays False
        "future of reduce_scatter",  # same
        "future of all_gather_into_tensor",  # value is the list of per-rank views, not [output]
        "PREMUL_SUM",  # "Cannot use ReduceOp.PREMUL_SUM with Gloo"
        "wide integer dtypes",  # int16/uint16/uint32/uint64: "Invalid scalar type"
        "raw dtypes",  # same for float8 and the wide integers in any collective
        "complex reduce and reduce_scatter",  # reduce/reduce_scatter_tensor do not view complex as real
        "unequal all_to_all lists",  # "ProcessGroupGloo::alltoall: invalid tensor size"
        "complex gather",  # dist.gather does not view complex as real: "Invalid scalar type"
        # all_reduce / broadcast on a view with gaps (x[::2], x[:, 1::3]) silently
        # give wrong values in gloo (dense views such as x.t() are fine).
        "in-place collectives on views with gaps",
    }
)


def known_gap(backend: str, feature: str) -> bool:
    """True if ``feature`` is a known gap of the substituted backend (gloo only)."""
    return backend == REFERENCE_BACKEND and feature in GLOO_GAPS


def skip_case(backend: str, op: str, dtype: torch.dtype) -> bool:
    """Reduction cases the backend under test cannot run (gloo's integer AVG only)."""
    return op == "AVG" and not dtype.is_floating_point and known_gap(backend, "AVG on integer dtypes")
