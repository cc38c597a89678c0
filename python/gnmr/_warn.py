# SPDX-License-Identifier: MIT
"""The package's warnings: through the "gnmr" logger when the application
configured logging, else through `warnings` (once either way: issue 63
found them printed twice, by both, when logging was configured)."""
import logging
import warnings

log = logging.getLogger("gnmr")


def warn(msg):
    """A warning, said once: to the "gnmr" logger when logging is
    configured (a handler on it or above it), else as a RuntimeWarning."""
    if log.hasHandlers():
        log.warning(msg)
    else:
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
