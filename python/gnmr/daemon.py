# SPDX-License-Identifier: MIT
"""`python -m gnmr.daemon [gnmrd options]` (or the `gnmr-daemon` command):
starts gnmrd for a one-machine run, in the foreground, with gnmrd's own
defaults (its agent endpoint is the one Controller uses by default, so a
training script on the same machine finds it with no endpoint given).

gnmrd is, in order: $GNMR_GNMRD, the one bundled in the wheel
(gnmr/bin/gnmrd), build/bin/gnmrd of a source checkout, gnmrd on PATH.
`python -m gnmr.daemon --which` prints the one it would run.
`python -m gnmr.ctl` (the `gnmr-ctl` command) runs gnmrctl the same way.
"""
import os
import shutil
import sys


def trusted(path):
    """Whether path, and every directory above it, can be changed only by
    this user or root: owned by one of them, and not writable by group or
    others (a directory with the sticky bit, as /tmp, may be
    world-writable: nobody else can replace what is in it). A gnmrd found
    beside the package is run only then: a copy of the package below a
    world-writable directory must not run whatever another user put in
    that directory's build/bin."""
    me = os.getuid()
    p = os.path.realpath(path)
    first = True
    while True:
        try:
            st = os.stat(p)
        except OSError:
            return False
        if st.st_uid not in (0, me):
            return False
        writable = st.st_mode & 0o022
        if writable and (first or not st.st_mode & 0o1000):
            return False
        first = False
        parent = os.path.dirname(p)
        if parent == p:
            return True
        p = parent


def find_gnmrd(name="gnmrd"):
    """The gnmrd (or gnmrctl) to run, or None: $GNMR_GNMRD (the user's
    word), the wheel's or a checkout's when trusted(), else PATH's."""
    env = os.environ.get("GNMR_" + name.upper())
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "bin", name),
                 os.path.join(here, "..", "..", "build", "bin", name)):
        if os.access(cand, os.X_OK) and trusted(cand):
            return os.path.normpath(cand)
    return shutil.which(name)


def main(argv=None, name="gnmrd"):
    argv = sys.argv[1:] if argv is None else argv
    exe = find_gnmrd(name)
    # the wheel's `gnmrd` command is this function: PATH's gnmrd may be the
    # command itself (a package without its programs), which would exec
    # itself for ever
    mark = "GNMR_WRAPPED_" + name.upper()
    if exe is not None and os.environ.get(mark) == os.path.realpath(exe):
        exe = None
    elif exe is not None:
        os.environ[mark] = os.path.realpath(exe)
    if argv == ["--which"]:
        print(exe or f"no {name} found")
        return 0 if exe else 1
    if exe is None:
        print(f"gnmr: no {name} found: install the gnmr wheel (it "
              f"bundles {name}), build it (make), or set "
              f"GNMR_{name.upper()}", file=sys.stderr)
        return 1
    # gnmrd becomes this process: signals and the exit status are its own
    os.execv(exe, [exe] + list(argv))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
