"""ringpg: a PyTorch process-group backend with hand-written, pipelined ring collectives.

``import ringpg`` registers the backend name ``"ringpg"`` with torch.distributed
for the cpu device, and cuda where the process sees a GPU; after that (or with no
import at all, through the ``torch.backends`` entry point) a script only needs::

    torch.distributed.init_process_group(backend="ringpg")

``ringpg.backend(group)`` gives the live backend object of a group (its transport,
its spin), see :mod:`ringpg._introspect`; ``with ringpg.use_transport("gloo"):`` makes
the groups created inside it move their data over Gloo's pairs, and
``with ringpg.use_algorithm("ring"):`` run the flat ring where ``RINGPG_ALGO`` would
pick the hierarchical algorithms, and ``with ringpg.use_copy("cma"):`` move large
same-host messages by single copy whatever the group would measure.

ringpg builds against torch 2.6 and newer; ``ringpg.features()`` says which of its
torch-dependent features this build carries (:mod:`ringpg._features`).

The compiled core lives in ``ringpg._C`` and is loaded lazily by the creator,
after :func:`ringpg._loader.load_extension` has checked that it was built for the
torch that is running.
"""

from __future__ import annotations

# torch first: its import ends by running the torch.backends entry points, ringpg's
# among them, which must find this package's modules whole, not half-imported.
import torch  # noqa: F401

from ._features import FeatureUnavailable
from ._introspect import backend
from ._loader import features
from ._registration import BACKEND_NAME, register, use_algorithm, use_copy, use_transport

__all__ = [
    "BACKEND_NAME",
    "FeatureUnavailable",
    "backend",
    "features",
    "register",
    "use_algorithm",
    "use_copy",
    "use_transport",
]
__version__ = "0.1.0"

register()
