"""``torch.backends`` entry point: runs at the end of ``import torch``.

It must never break ``import torch``: it only registers the Python creator (the
compiled extension is loaded later, when a ringpg group is created), and any
failure here becomes a warning.
"""

from __future__ import annotations

import warnings


def register() -> None:
    try:
        from ._registration import register as _register

        _register()
    except Exception as e:  # noqa: BLE001 - an autoload hook must not raise
        warnings.warn(f"ringpg: backend autoload failed, use `import ringpg` to see why: {e!r}", stacklevel=2)
