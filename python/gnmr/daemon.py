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
import atexit
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


log = logging.getLogger("gnmr")


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


def listening(endpoint):
    """Whether something accepts connections on an ipc:// endpoint (a
    gnmrd: its socket file is there and connect() is taken). Other
    endpoints are taken as there: only the default endpoint, always
    ipc://, is asked."""
    if not endpoint.startswith("ipc://"):
        return True
    path = endpoint[len("ipc://"):]
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def foreign(endpoint):
    """For the default ipc:// endpoint (a per-user path: /tmp/gnmr-UID,
    $XDG_RUNTIME_DIR/gnmr): None when its directory is absent or this
    user's own (owned by this user, not a symbolic link, no access for
    group or others); else a few words saying whose it is. Whoever else
    made it (another user, a system account) could serve a gnmrd there
    that decides this trainer's steps and keeps its history (issue 62):
    the default is joined only when it is the user's own."""
    if not endpoint.startswith("ipc://"):
        return None
    d = os.path.dirname(endpoint[len("ipc://"):]) or "."
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{d} cannot be read ({e.strerror})"
    import stat as _stat
    if _stat.S_ISLNK(st.st_mode):
        return f"{d} is a symbolic link"
    if not _stat.S_ISDIR(st.st_mode):
        return f"{d} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{d} belongs to uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"{d} is open to others (mode {st.st_mode & 0o7777:04o})"
    return None


def own_dir(path, what):
    """Makes (0700) or checks a directory this user's trainer keeps its
    own things in: never one reached through a symbolic link, nor one
    another user owns (in a shared directory such as /tmp or a 1777 work
    area, whoever made it first could read or replace what goes in).
    PermissionError naming the directory, its owner and the fix."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise PermissionError(f"gnmr: {what} {path}: {e.strerror}") from None
    import stat as _stat
    if _stat.S_ISLNK(st.st_mode) or not _stat.S_ISDIR(st.st_mode):
        raise PermissionError(
            f"gnmr: {what} {path} is {'a symbolic link' if _stat.S_ISLNK(st.st_mode) else 'not a directory'}: "
            "refusing to keep the history where it can point anywhere; "
            "give data_dir= (or GNMR_DATA_DIR) a directory of your own")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"gnmr: {what} {path} belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}): refusing to keep the history where "
            "another user can read or replace it; give data_dir= (or "
            "GNMR_DATA_DIR) a directory of your own")
    return path


def held_by_another(data_dir):
    """Raises RuntimeError when a gnmrd holds data_dir's lock (gnmrd.lock,
    flock: what gnmrd itself takes), naming the likely cause: two jobs
    given one output_dir (or data_dir) (issue 63: the second died with
    the first gnmrd's log lines and no hint)."""
    import fcntl
    path = os.path.join(data_dir, "gnmrd.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # none yet: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RuntimeError(
            f"gnmr: another gnmrd already keeps its history in {data_dir} "
            "(another job's private gnmrd: two jobs given one output_dir "
            "or data_dir share it). Give this job its own output_dir or "
            "data_dir=, or start one gnmrd for both (python -m gnmr.daemon) "
            "and give its endpoint") from None
    except OSError:
        return
    finally:
        os.close(fd)


RUN_PREFIX = "gnmr-private-"


def sweep_stale(base):
    """Removes the sockets' directories that private gnmrds of this user
    left in base (RUN_PREFIX, made by mkdtemp) when their trainer was
    killed (a SIGKILL leaves no one to remove them): each only when it
    is this user's (owned, not a link), holds nothing but the two
    sockets, was last changed over two minutes ago (one being made now
    is empty until its gnmrd starts) and nothing listens on its
    sockets. A live private gnmrd's, or anything else, is left alone."""
    import stat as _stat
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(RUN_PREFIX):
            continue
        d = os.path.join(base, name)
        try:
            st = os.lstat(d)
            held = set(os.listdir(d))
        except OSError:
            continue
        if (not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or
                not held <= {"agents.sock", "admin.sock"} or
                time.time() - st.st_mtime < 120):
            continue  # not a private gnmrd's, or one that may be starting
        if any(listening("ipc://" + os.path.join(d, f)) for f in held):
            continue
        shutil.rmtree(d, ignore_errors=True)


class Private:
    """A gnmrd started for one job, when none is configured or listening
    (the training side's daemon="auto", docs/python.md "A private
    gnmrd"): gnmrd as find_gnmrd() finds it, its history in data_dir
    (gnmrctl --store DATA_DIR reads it afterwards), its log in
    data_dir/gnmrd.log, its sockets in a fresh 0700 directory of
    $XDG_RUNTIME_DIR (else the temporary directory), in a session of its
    own (a terminal's Ctrl-C is the trainer's to handle). It stops with
    stop(), at this interpreter's exit, and, through GNMRD_PARENT_PID,
    when this process dies however it dies; its sockets' directory goes
    with it."""

    def __init__(self, data_dir, wait_s=30.0):
        exe = find_gnmrd()
        if exe is None:
            raise RuntimeError(
                "gnmr: no gnmrd is listening and none was found to start "
                "a private one: install the gnmr wheel (it bundles gnmrd), "
                "build it (make), set GNMR_GNMRD, or start gnmrd and give "
                "its endpoint (GNMR_ENDPOINT)")
        self.data_dir = own_dir(data_dir, "the private gnmrd's data "
                                "directory")
        held_by_another(self.data_dir)
        base = os.environ.get("XDG_RUNTIME_DIR")
        if not base or not os.path.isdir(base):
            base = None
        sweep_stale(base or tempfile.gettempdir())
        self.run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=base)
        self.agents = f"ipc://{self.run_dir}/agents.sock"
        self.admin = f"ipc://{self.run_dir}/admin.sock"
        self.log_path = os.path.join(self.data_dir, "gnmrd.log")
        env = dict(os.environ, GNMRD_PARENT_PID=str(os.getpid()))
        # what it creates is the user's alone: the log 0600, and gnmrd's
        # files (the history, its snapshots) under umask 077
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND |
                     os.O_NOFOLLOW, 0o600)
        # this gnmrd's part of a log an earlier one may have written
        self._log_from = os.fstat(fd).st_size
        with os.fdopen(fd, "ab") as log:
            self.proc = subprocess.Popen(
                [exe, "--data-dir", self.data_dir, "--agents", self.agents,
                 "--admin", self.admin], stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, env=env, close_fds=True,
                umask=0o077,
                # a session of its own: a terminal's Ctrl-C (SIGINT to
                # the foreground group) reaches the trainer, which stops
                # it on its way out; it never dies first under a trainer
                # that goes on (issue 63)
                start_new_session=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + wait_s
        sock = os.path.join(self.run_dir, "admin.sock")
        while self.proc.poll() is None and not os.path.exists(sock) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        if self.proc.poll() is not None or not os.path.exists(sock):
            code = self.proc.poll()
            why = (f"exit status {code}" if code is not None else
                   f"no sockets after {wait_s:.0f} s")
            self.stop()
            raise RuntimeError(
                f"gnmr: the private gnmrd ({exe}) did not start ({why}); "
                f"its log, {self.log_path}, ends:\n{self._tail()}")
        self.pid = self.proc.pid

    def _tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(getattr(self, "_log_from", 0), f.tell() - n))
                return f.read().decode("utf-8", "backslashreplace")
        except OSError:
            return "(unreadable)"

    def ended(self, job, wait_s=2.0):
        """Waits (at most wait_s) until gnmrd has taken the job's Byes:
        the job no longer live in `gnmrctl jobs`. A SIGTERM sent right
        after the trainer's Bye could stop gnmrd before it read the Bye:
        the run then stayed 'running' in the history, the next private
        gnmrd on the same data directory took it up again (a new pass)
        and `--store` reads called it interrupted (seen under load in the
        README's quickstart, where two snippets share one directory).
        Nothing to wait for when gnmrctl is not found."""
        ctl = find_gnmrd("gnmrctl")
        p = getattr(self, "proc", None)
        if ctl is None or p is None or p.poll() is not None:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                r = subprocess.run([ctl, "--admin", self.admin, "jobs",
                                    "--json"], capture_output=True,
                                   text=True, timeout=wait_s)
                live = [j for j in json.loads(r.stdout or "[]")
                        if j.get("name") == job and j.get("live")]
            except (OSError, ValueError, subprocess.SubprocessError):
                return   # gnmrctl cannot tell: stop as before
            if not live:
                return
            time.sleep(0.02)

    def stop(self, wait_s=30.0):
        """Stops gnmrd (SIGTERM: it commits what it holds and snapshots
        every job), then removes its sockets' directory."""
        p = getattr(self, "proc", None)
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(wait_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(getattr(self, "run_dir", ""), ignore_errors=True)
        atexit.unregister(self.stop)


def private_endpoint(endpoint, daemon, data_dir, job):
    """(the endpoint to use, the Private gnmrd started or None): where
    daemon= and the world say to start one, global rank 0 starts it and
    the others of its machine are told its endpoint (a collective: every
    rank builds its Controller). A job over more than one machine gets
    none: another machine's ranks could not reach it."""
    import torch.distributed as dist
    world, rank = 1, 0
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    if world > 1 and int(os.environ.get("LOCAL_WORLD_SIZE", world)) != world:
        if daemon == "private":
            raise ValueError(
                f"daemon='private': this job's {world} ranks are on more "
                "than one machine, which a private gnmrd (ipc://, one "
                "machine) cannot serve; start gnmrd on a node they all "
                "reach and give its endpoint (docs/operations.md)")
        return endpoint, None
    got = None
    if rank == 0 and (daemon == "private" or
                      not listening(endpoint)):
        where = data_dir or os.environ.get("GNMR_DATA_DIR") or "gnmr"
        try:
            got = Private(where)
        except Exception as e:  # every rank is told, then raises
            got = e
    if world > 1:
        said = [got.agents if isinstance(got, Private) else
                None if got is None else f"error: {got}"]
        dist.broadcast_object_list(said, src=0)
        if rank != 0 and said[0] is not None:
            if said[0].startswith("error: "):
                raise RuntimeError(f"gnmr: rank 0 could not start a private "
                                   f"gnmrd: {said[0][7:]}")
            return said[0], None
    if isinstance(got, Exception):
        raise got
    if got is None:
        return endpoint, None
    msg = (f"gnmr: no gnmrd listening at {endpoint}: started a private "
           f"gnmrd for job {job!r} (pid {got.pid}; history in "
           f"{got.data_dir}, log {got.log_path}; it stops with this "
           f"process; afterwards: gnmrctl --store {got.data_dir} "
           f"decisions {job}). Give endpoint= or GNMR_ENDPOINT to use "
           "a gnmrd of your own, daemon='never' for none")
    log.warning(msg)
    return got.agents, got


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
