"""Finished runs kept on disk, so that a long sweep (an fp4 run is ~12
CPU-minutes, the sweep hours) goes on where it stopped when its process,
its session or its machine goes away (--keep-runs DIR).

A run is kept under a key that holds everything its numbers depend on:
the setting, the variant, the seed, every option but those that only say
where output goes or how many processes run (the runs are deterministic
and --jobs does not change them), and a digest of the code that ran: the
experiment scripts, the gnmr package, gnmrd and the agent library. A
changed byte in any of them is another key, so a kept run is only ever
one the current code would compute again, bit for bit. What a run gives
for (seed, variant) does not depend on another run but GNMR's own of its
seed (random and rawnorm take its share), which has its key beside it.
"""
import glob
import hashlib
import json
import os
import pickle

# options that say where output goes, how the runs are spread or which
# runs a sweep holds, never what a run computes: a sweep of fewer
# variants or other seeds takes the runs it shares with an earlier one
# (a run reads no other variant's or seed's but GNMR's of its seed, whose
# name, --share-of, stays in the key)
NOT_IN_KEY = frozenset({"jobs", "json", "plot", "keep_runs", "gnmrd_bin",
                        "kept_taken", "variants", "seeds", "seed_list"})


def _digest_files(paths):
    h = hashlib.sha256()
    for p in paths:
        h.update(p.encode() + b"\0")
        try:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            h.update(b"<absent>")
    return h.hexdigest()


def code_digest(root, gnmrd_bin):
    """The code a run executes, by content (not by commit: a commit that
    touches only the daemon's tests keeps the runs)."""
    from gnmr import _lib
    files = sorted(glob.glob(os.path.join(root, "experiments", "*.py")))
    files += sorted(glob.glob(os.path.join(root, "python", "gnmr", "**",
                                           "*.py"), recursive=True))
    files.append(os.path.join(gnmrd_bin, "gnmrd"))
    # the library the runs load: the first of gnmr's places that exists
    files += [next((c for c in _lib.candidates() if os.path.exists(c)),
                   "<no agent library>")]
    return _digest_files(files)


def run_key(setting_name, variant, seed, args, digest):
    opts = {k: v for k, v in sorted(vars(args).items())
            if k not in NOT_IN_KEY}
    text = json.dumps([setting_name, variant, seed, opts, digest],
                      sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Kept:
    """DIR/KEY.pkl for each finished run; written whole (a temporary file
    renamed), so a run cut off in its write is not kept at all."""

    def __init__(self, directory, setting_name, args, root):
        self.dir = directory
        self.name = setting_name
        self.args = args
        self.digest = code_digest(root, args.gnmrd_bin)
        self.taken = 0
        os.makedirs(directory, exist_ok=True)

    def _path(self, seed, variant):
        return os.path.join(self.dir, run_key(self.name, variant, seed,
                                              self.args, self.digest)
                            + ".pkl")

    def get(self, seed, variant):
        try:
            with open(self._path(seed, variant), "rb") as f:
                r = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None
        if not isinstance(r, dict) or "val" not in r:
            return None
        self.taken += 1
        print(f"seed {seed} {variant:10s} val {r['val']:.4f} (kept in "
              f"{self.dir})", flush=True)
        return r

    def put(self, seed, variant, result):
        path = self._path(seed, variant)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        os.replace(tmp, path)
