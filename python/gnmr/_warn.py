# SPDX-License-Identifier: MIT
"""The package's warnings: through `warnings` and, when the application
configured logging, the "gnmr" logger."""
import logging
import warnings

log = logging.getLogger("gnmr")


def warn(msg):
    """A warning through `warnings` and, when the application configured
    logging, the "gnmr" logger (not twice on stderr otherwise)."""
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    if log.hasHandlers():
        log.warning(msg)
