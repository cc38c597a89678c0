# SPDX-License-Identifier: MIT
"""`python -m gnmr.ctl COMMAND ...` (or `gnmr-ctl`): gnmrctl, found as
gnmr.daemon finds gnmrd ($GNMR_GNMRCTL, the wheel's, build/bin's, PATH's)."""
import sys

from .daemon import main as _main


def main(argv=None):
    return _main(argv, name="gnmrctl")


if __name__ == "__main__":
    sys.exit(main())
