# SPDX-License-Identifier: MIT
"""gnmr.Options: everything a Controller, and the trainer callbacks, can
be told, in one typed and documented object, checked in full when it is
made: before any gnmrd, thread or socket starts (issue 63).

    opts = gnmr.Options(job="my-run", wait_ms=200, params={"alpha": 8})
    ctl = Controller(model, options=opts)            # or, as before,
    ctl = Controller(model, job="my-run", wait_ms=200)

A bad value is a ValueError that names the option, the value, what is
allowed and where it is documented (docs/python.md, "Options"); a
misspelt option a TypeError naming the closest ones. `opts.replace(**f)`
is a copy with some fields changed, checked again. `table()` is the
markdown table of docs/python.md (generated from FIELDS, so the two
cannot drift: test_docs checks it).
"""
import dataclasses
import difflib
import re

DOCS = "docs/python.md#options"

# (name, default, what it is): the order of the docs' table
FIELDS = [
    ("job", None, "the job's name, shared by all its ranks (else $GNMR_JOB)"),
    ("endpoint", None, "gnmrd's agent endpoint (ipc://PATH, tcp://HOST:"
     "PORT, or a comma-separated list); None: $GNMR_ENDPOINT, else gnmrd's "
     "default, where daemon= may start a private gnmrd"),
    ("daemon", "auto", "'auto': a private gnmrd when none is configured or "
     "listening; 'private': always one; 'never': none"),
    ("data_dir", None, "where a private gnmrd keeps its history (else "
     "$GNMR_DATA_DIR, else ./gnmr); made 0700, never another user's"),
    ("select", "(torch.nn.Linear,)", "the module types that are units"),
    ("pattern", None, "a regular expression on module names: only those "
     "that match are units"),
    ("experts", False, "a module of fused MoE expert weights is one unit "
     "an expert"),
    ("on_route", None, "fn(name, module, high) called when a unit's route "
     "changes (gnmr.recovery.switch); False: read the decisions, switch "
     "nothing"),
    ("on_decision", None, "fn(StepResult) after every step"),
    ("params", None, "the job's policy parameters: a dict of overrides "
     "({'alpha': 8}) or gnmr.default_params(...) (docs/policy.md)"),
    ("measure", None, "fn(name, module) -> the recipe's measure of the "
     "unit's low-cost path error (>= 0, inf, None): the measured signal"),
    ("same_step", False, "units whose measure passes gnmrd's bound take "
     "their recovery path within the step (needs measure=)"),
    ("shadow", None, "fn(name, module) -> bool: the low-cost path would "
     "have been damaged (reported as non-finite)"),
    ("shadow_low", False, "ask shadow= of the units on their low-cost "
     "path too"),
    ("wait_ms", 50, "how long step() waits for the decision, ms"),
    ("accumulate", 1, "micro-batches per optimizer step: the N-th "
     "step() call reports"),
    ("trace", None, "a file to write the norms gnmrd decided from "
     "(step,unit,norm CSV)"),
    ("warn_after", 3, "steps without gnmrd before the warning"),
    ("join_wait_ms", 1000, "how long the first steps may wait for the "
     "agent to join, ms"),
    ("reduce_threads", 0, "threads of the host norms' pass (0: automatic)"),
    ("tp_size", None, "model-parallel shards per replica (else the "
     "DeviceMesh, or 1)"),
    ("tp_group", None, "the process group of one replica's shards"),
    ("global_rank", None, "this process's rank (else torch.distributed, "
     "RANK, SLURM_PROCID)"),
    ("resume", None, "None: say nothing; True: a resume from a "
     "checkpoint; False: a fresh start (docs/python.md, 'Runs and "
     "resumes')"),
    ("barrier_ms", 0, "gnmrd's per-step barrier, ms (0: its default)"),
    ("node_ranks", None, "reporters per node, for a node relay (else the "
     "launcher's ranks per node when every rank reports; 0: each its own)"),
    ("fallback_route", "low", "the route while no decision is fresh: "
     "'low' or 'high'"),
    ("fallback_after", 0, "steps a stale decision is still used (0: 3)"),
    ("unit_ids", None, "the job-wide id of each unit (else in order)"),
    ("curve_keys", None, "(server public, client public, client secret) "
     "CURVE keys"),
    ("from_env", False, "read the agent's GNMR_* variables over these"),
]
NAMES = [f[0] for f in FIELDS]
_DEFAULTS = {n: d for n, d, _ in FIELDS}


def _bad(name, value, allowed):
    return ValueError(f"gnmr: {name}={value!r}: {allowed} ({DOCS})")


def _int(name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or \
            (hi is not None and v > hi):
        raise _bad(name, v, f"an integer from {lo}" +
                   (f" to {hi}" if hi is not None else " up"))


def _fn(name, v, false_ok=False):
    if v is None or (false_ok and v is False) or callable(v):
        return
    raise _bad(name, v, "a function" + (", False" if false_ok else "") +
               " or None")


def _flag(name, v):
    if not isinstance(v, bool):
        raise _bad(name, v, "True or False")


def _text(name, v, empty_ok=False):
    if v is None:
        return
    if not isinstance(v, str) or (not v and not empty_ok):
        raise _bad(name, v, "a non-empty string or None")
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in v):
        raise _bad(name, v, "no control characters")


def _check_policy(v):
    """params: None, a mapping of overrides, or gnmr.default_params(...):
    checked by the parameter table the C side uses (gnmr.policy.params)."""
    if v is None:
        return
    from . import _lib
    from .policy import params as check
    if isinstance(v, _lib.Params):
        kw = {}
        for name, *rest in _lib.Params._fields_:
            x = getattr(v, name)
            kw[name] = None if (x == 0 and name in ("early_alpha",
                                                    "early_beta")) else x
    elif hasattr(v, "items"):
        kw = dict(v.items())
    else:
        raise _bad("params", v, "a dict of policy parameters or "
                   "gnmr.default_params(...)")
    try:
        check(**kw)
    except ValueError as e:
        raise ValueError(f"gnmr: params: {e} (docs/policy.md)") from None


def _check_select(v):
    if not isinstance(v, (tuple, list)) or not v or \
            not all(isinstance(t, type) for t in v):
        raise _bad("select", v, "a non-empty tuple of module types")


def _check_pattern(v):
    if v is None:
        return
    if not isinstance(v, str):
        raise _bad("pattern", v, "a regular expression (a string) or None")
    try:
        re.compile(v)
    except re.error as e:
        raise _bad("pattern", v, f"a regular expression ({e})") from None


def _check_endpoint(v):
    _text("endpoint", v)
    if v is None:
        return
    import ctypes
    from .agent import lib
    why = ctypes.create_string_buffer(1024)
    rv = lib().gnmr_endpoint_check(v.encode(), why, len(why))
    if rv == -21:   # GNMR_E_DENIED: another user's socket directory
        raise PermissionError(f"gnmr: endpoint={v!r}: "
                              f"{why.value.decode(errors='replace')}")
    if rv != 0:
        raise _bad("endpoint", v, why.value.decode(errors="replace"))


def _one_of(name, v, allowed):
    if v not in allowed:
        raise _bad(name, v, " or ".join(repr(a) for a in allowed))


def _check_job(v):
    _text("job", v)
    if v is not None and len(v.encode()) > 128:
        raise _bad("job", v, "at most 128 bytes")


def _check_ids(v):
    if v is not None and not all(
            isinstance(i, int) and not isinstance(i, bool) and
            0 <= i < 2 ** 32 - 1 for i in v):
        raise _bad("unit_ids", v, "a list of ids from 0 to 2^32 - 2")


def _check_keys(v):
    if v is not None and not (isinstance(v, (tuple, list)) and len(v) == 3
                              and all(isinstance(k, str) for k in v)):
        raise _bad("curve_keys", "...", "three strings (server public, "
                   "client public, client secret)")


_CHECKS = {
    "job": _check_job,
    "endpoint": _check_endpoint,
    "daemon": lambda v: _one_of("daemon", v, ("auto", "private", "never")),
    "data_dir": lambda v: _text("data_dir", v),
    "select": _check_select,
    "pattern": _check_pattern,
    "experts": lambda v: _flag("experts", v),
    "on_route": lambda v: _fn("on_route", v, false_ok=True),
    "on_decision": lambda v: _fn("on_decision", v),
    "params": _check_policy,
    "measure": lambda v: _fn("measure", v),
    "same_step": lambda v: _flag("same_step", v),
    "shadow": lambda v: _fn("shadow", v),
    "shadow_low": lambda v: _flag("shadow_low", v),
    "wait_ms": lambda v: _int("wait_ms", v, 0, 3600000),
    "accumulate": lambda v: _int("accumulate", v, 1),
    "trace": lambda v: _text("trace", v),
    "warn_after": lambda v: _int("warn_after", v, 1),
    "join_wait_ms": lambda v: _int("join_wait_ms", v, 0, 3600000),
    "reduce_threads": lambda v: _int("reduce_threads", v, 0, 1024),
    "tp_size": lambda v: v is None or _int("tp_size", v, 1),
    "tp_group": lambda v: None,
    "global_rank": lambda v: v is None or _int("global_rank", v, 0),
    "resume": lambda v: _one_of("resume", v, (None, True, False)),
    "barrier_ms": lambda v: _int("barrier_ms", v, 0, 600000),
    "node_ranks": lambda v: v is None or _int("node_ranks", v, 0, 4096),
    "fallback_route": lambda v: _one_of("fallback_route", v,
                                        ("low", "high")),
    "fallback_after": lambda v: _int("fallback_after", v, 0, 2 ** 32 - 1),
    "unit_ids": _check_ids,
    "curve_keys": _check_keys,
    "from_env": lambda v: _flag("from_env", v),
}
assert set(_CHECKS) == set(NAMES)


def _default(name):
    d = _DEFAULTS[name]
    if name == "select":
        import torch
        return (torch.nn.Linear,)
    return d


@dataclasses.dataclass(frozen=True)
class Options:
    """The Controller's options (module doc); FIELDS documents each."""
    job: object = None
    endpoint: object = None
    daemon: object = "auto"
    data_dir: object = None
    select: object = None
    pattern: object = None
    experts: object = False
    on_route: object = None
    on_decision: object = None
    params: object = None
    measure: object = None
    same_step: object = False
    shadow: object = None
    shadow_low: object = False
    wait_ms: object = 50
    accumulate: object = 1
    trace: object = None
    warn_after: object = 3
    join_wait_ms: object = 1000
    reduce_threads: object = 0
    tp_size: object = None
    tp_group: object = None
    global_rank: object = None
    resume: object = None
    barrier_ms: object = 0
    node_ranks: object = None
    fallback_route: object = "low"
    fallback_after: object = 0
    unit_ids: object = None
    curve_keys: object = None
    from_env: object = False

    def __post_init__(self):
        if self.select is None:
            object.__setattr__(self, "select", _default("select"))
        if isinstance(self.select, list):
            object.__setattr__(self, "select", tuple(self.select))
        for name in NAMES:
            _CHECKS[name](getattr(self, name))
        if self.shadow_low and self.shadow is None:
            raise _bad("shadow_low", True, "asks shadow= of the units on "
                       "their low-cost path too: give shadow= as well")
        if self.same_step and self.measure is None:
            raise _bad("same_step", True, "switches units by their measure: "
                       "give measure= as well")

    def replace(self, **fields):
        """A copy with fields changed (checked as new options are)."""
        unknown(fields)
        return dataclasses.replace(self, **fields)

    def agent_kwargs(self):
        """What the Agent takes of these."""
        return {k: getattr(self, k) for k in (
            "params", "barrier_ms", "fallback_route", "fallback_after",
            "unit_ids", "curve_keys", "from_env", "resume")}


assert [f.name for f in dataclasses.fields(Options)] == NAMES


def unknown(fields, also=()):
    """TypeError naming the keywords that are not options (nor in also),
    with the closest option names."""
    bad = [k for k in fields if k not in NAMES and k not in also]
    if not bad:
        return
    from ._params import PARAMS
    policy = {p[0] for p in PARAMS}
    hints = []
    for k in bad:
        close = difflib.get_close_matches(k, NAMES + list(also), n=2)
        hints.append(f"{k!r}" + (
            f" (a policy parameter: params={{{k!r}: ...}})" if k in policy
            else f" (did you mean {' or '.join(close)}?)" if close else ""))
    raise TypeError(f"gnmr: not an option: {', '.join(hints)}; the options "
                    f"are in {DOCS}")


def make(options=None, also=(), **fields):
    """Options from options= and keyword fields (the keywords win),
    checked: TypeError for a keyword that is not an option."""
    unknown(fields, also)
    if options is None:
        return Options(**fields)
    if not isinstance(options, Options):
        raise TypeError(f"gnmr: options={options!r}: a gnmr.Options "
                        f"({DOCS})")
    return options.replace(**fields) if fields else options


def table():
    """The docs' table of the options (docs/python.md, "Options")."""
    rows = ["| option | default | what it is |", "|---|---|---|"]
    for name, default, what in FIELDS:
        d = "None" if default is None else (
            default if isinstance(default, str) and default.startswith("(")
            else repr(default))
        rows.append(f"| `{name}` | `{d}` | {what} |")
    return "\n".join(rows)

