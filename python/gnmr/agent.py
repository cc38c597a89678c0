# SPDX-License-Identifier: MIT
"""The GNMR agent for Python: a thin ctypes layer over libgnmr-agent.

An Agent joins a job on gnmrd, reports per-unit gradient sums of squares
each step (from host tensors, reduced by the library in fp64, or already
reduced), and answers which path each unit takes at the next step. Errors
are GnmrError exceptions carrying the library's error code. Nothing here
waits on the network beyond the timeout a call is given.
"""
import ctypes
import math
import os
import struct

from . import _lib

# Loaded at import: a missing library is an ImportError saying how to fix
# it, not an OSError at the first call.
_LIB = _lib.load()


def lib():
    """The loaded libgnmr-agent."""
    return _LIB


class GnmrError(Exception):
    """An error code of GNMR's error table (include/gnmr/error.h)."""

    def __init__(self, code, what=""):
        self.code = code
        self.name = lib().gnmr_errname(code).decode()
        msg = lib().gnmr_strerror(code).decode()
        super().__init__(f"{what}: {msg} ({self.name})" if what else
                         f"{msg} ({self.name})")


_CLOSED = -13  # GNMR_E_CLOSED
_DENIED = -21  # GNMR_E_DENIED


def _check(rv, what):
    if rv != 0:
        raise GnmrError(rv, what)


def default_params(**overrides):
    """The policy's default parameters, with keyword overrides
    (alpha, beta, window, max_active, lock_steps, warmup_steps,
    early_alpha, early_beta, early_steps)."""
    p = _lib.Params()
    lib().gnmr_params_default(ctypes.byref(p))
    for key, value in overrides.items():
        if not any(key == f[0] for f in _lib.Params._fields_):
            raise ValueError(
                f"unknown policy parameter {key!r} (the parameters: "
                f"{', '.join(f[0] for f in _lib.Params._fields_)})")
        try:
            setattr(p, key, value)
        except TypeError:
            raise ValueError(f"policy parameter {key}: {value!r} is not a "
                             f"number") from None
    return p


def as_params(params):
    """params as the agent's parameters: None (the defaults), a mapping of
    overrides ({"alpha": 1.1}), or what default_params() returns."""
    if params is None:
        return default_params()
    if isinstance(params, _lib.Params):
        return params
    if hasattr(params, "items"):
        return default_params(**dict(params.items()))
    raise ValueError(f"params: expected a dict of policy parameters (or "
                     f"gnmr.default_params(...)), not {type(params).__name__}")


_DTYPE_CODES = {"float32": _lib.DTYPE_F32, "float16": _lib.DTYPE_F16,
                "bfloat16": _lib.DTYPE_BF16, "float64": _lib.DTYPE_F64,
                "float8_e4m3fn": _lib.DTYPE_F8E4M3,
                "float8_e5m2": _lib.DTYPE_F8E5M2}


def _dtype_code(dtype_name):
    return _DTYPE_CODES[dtype_name]


# gnmr_tensor as packed bytes: setting a ctypes array's fields one by one
# costs several microseconds a tensor, which a model of 10k units pays
# every step
_TENSOR = struct.Struct("=QQIId")
assert _TENSOR.size == ctypes.sizeof(_lib.Tensor)


def _tensor_array(buffers, n_units):
    """(unit, pointer, numel, dtype name[, scale]) tuples as gnmr_tensor."""
    n = len(buffers)
    buf = bytearray(_TENSOR.size * max(n, 1))
    pack, size, codes = _TENSOR.pack_into, _TENSOR.size, _DTYPE_CODES
    for i, b in enumerate(buffers):
        unit, ptr, numel, dtype = b[:4]
        if not 0 <= unit < n_units:
            raise ValueError(f"unit {unit} out of range")
        pack(buf, i * size, ptr or 0, numel, codes[dtype], unit,
             b[4] if len(b) > 4 else 0.0)
    return (_lib.Tensor * max(n, 1)).from_buffer(buf), n


def _array(ctype, values, n, what):
    """values as a ctypes array of n ctype: as it is when it is one (a
    host reduction's output), else copied (booleans as 0/1); None stays
    None."""
    if values is None:
        return None
    if isinstance(values, ctypes.Array):
        if values._type_ is not ctype or len(values) != n:
            raise ValueError(f"{what}: a ctypes array of {n} "
                             f"{ctype.__name__}")
        return values
    if len(values) != n:
        raise ValueError(f"{what} has {len(values)} values for {n} units")
    if ctype is ctypes.c_uint8:
        values = [1 if x else 0 for x in values]
    return (ctype * n)(*values)


class Agent:
    """One reporter (or observer) of a job.

    unit_names: this rank's units; the same name on several ranks is one
    unit sharded over them. params: a Params (default_params()). With
    from_env, GNMR_* environment variables override the arguments (see
    include/gnmr/agent.h for the table)."""

    def __init__(self, endpoint, job, unit_names, rank=0, reporters=1,
                 params=None, barrier_ms=0, fallback_route="low",
                 fallback_after=0, observer=False, unit_ids=None,
                 curve_keys=None, from_env=False, resume=None,
                 node_ranks=0):
        self._a = ctypes.c_void_p()
        self._routes_buf = None
        if endpoint is None:
            endpoint = _lib.default_endpoint()
        self.endpoint, self.job, self.rank = endpoint, job, rank
        self.n_units = len(unit_names)
        if self.n_units == 0:
            raise ValueError("an agent needs at least one unit")
        names = [n.encode() for n in unit_names]
        self._names = (ctypes.c_char_p * self.n_units)(*names)
        cfg = _lib.AgentConfig()
        self._keep = [endpoint.encode(), job.encode()]
        cfg.endpoint = self._keep[0]
        cfg.job = self._keep[1]
        cfg.rank = rank
        cfg.reporters = reporters
        cfg.unit_names = self._names
        cfg.n_units = self.n_units
        if unit_ids is not None:
            if len(unit_ids) != self.n_units:
                raise ValueError("unit_ids must have one id per unit")
            self._ids = (ctypes.c_uint32 * self.n_units)(*unit_ids)
            cfg.unit_ids = self._ids
        self.params = as_params(params)  # the job's, as asked for
        cfg.params = self.params
        cfg.barrier_ms = barrier_ms
        if fallback_route not in ("low", "high"):
            raise ValueError("fallback_route is 'low' or 'high'")
        cfg.fallback_route = (_lib.ROUTE_HIGH if fallback_route == "high"
                              else _lib.ROUTE_LOW)
        cfg.fallback_after = fallback_after
        cfg.observer = 1 if observer else 0
        cfg.node_ranks = node_ranks  # Hello.node_ranks (a node relay's)
        # what this process says of itself on its first Hello: None
        # nothing, False a fresh start, True a resume (docs/python.md,
        # "Runs and resumes")
        if resume not in (None, False, True):
            raise ValueError(f"resume={resume!r}: None (say nothing), "
                             "False (a fresh start) or True (a resume)")
        cfg.start = (_lib.START_ANY if resume is None else
                     _lib.START_RESUME if resume else _lib.START_FRESH)
        if curve_keys is not None:
            server, public, secret = (k.encode() for k in curve_keys)
            self._keep += [server, public, secret]
            cfg.curve_server_key = server
            cfg.curve_public_key = public
            cfg.curve_secret_key = secret
        if from_env:
            bad = ctypes.c_char_p()
            rv = lib().gnmr_agent_config_from_env(ctypes.byref(cfg),
                                                  ctypes.byref(bad))
            if rv != 0:
                raise GnmrError(rv, f"environment variable "
                                    f"{bad.value.decode()}")
        why = ctypes.create_string_buffer(1024)
        erv = lib().gnmr_endpoint_check(cfg.endpoint, why, len(why))
        if erv != 0:
            text = why.value.decode(errors="replace")
            if erv == _DENIED:
                raise PermissionError(f"endpoint: {text}")
            raise ValueError(f"endpoint: {text}")
        _check(lib().gnmr_agent_open(ctypes.byref(cfg), ctypes.byref(self._a)),
               f"gnmr_agent_open (endpoint {cfg.endpoint.decode()}, job "
               f"{cfg.job.decode()!r}, rank {cfg.rank}/{cfg.reporters})")
        self.endpoint = cfg.endpoint.decode()
        self.observer = bool(cfg.observer)

    def close(self):
        """Says Bye and frees the agent; safe to call twice."""
        if self._a:
            lib().gnmr_agent_close(ctypes.byref(self._a))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def report_sums(self, step, sumsq, nonfinite=None, not_reported=None,
                    shadowed=None):
        """Reports already-reduced values, one per unit: sums of squares
        (>= 0), counts of NaN/Inf elements, units with no value, and units
        whose low-cost path the recipe measured as damaged (scored as
        non-finite by gnmrd, recorded as `shadowed`). Each is a sequence
        or a ctypes array of the library's type (c_double, c_uint64,
        c_uint8, c_uint8), which is passed as it is."""
        n = self.n_units
        if len(sumsq) != n:
            raise ValueError(f"sumsq has {len(sumsq)} values for {n} units")
        s = _array(ctypes.c_double, sumsq, n, "sumsq")
        nf = _array(ctypes.c_uint64, nonfinite, n, "nonfinite")
        nr = _array(ctypes.c_uint8, not_reported, n, "not_reported")
        sh = _array(ctypes.c_uint8, shadowed, n, "shadowed") \
            if shadowed is not None and (isinstance(shadowed, ctypes.Array)
                                         or any(shadowed)) else None
        self._check_report(lib().gnmr_agent_report_sums_shadowed(
            self._a, step, s, nf, nr, sh), step)

    def measure(self, step, values):
        """The recipe's measure of each unit's low-cost path error at
        `step` (docs/policy.md, "Measured signal"), sent with that step's
        report whichever call makes it: one value a unit, a number >= 0,
        inf (the low path's result would not be finite) or NaN/None (not
        measured). Call before the step's report."""
        n = self.n_units
        if len(values) != n:
            raise ValueError(f"measure has {len(values)} values for {n} "
                             "units")
        arr = values if isinstance(values, ctypes.Array) else \
            (ctypes.c_double * n)(*[math.nan if v is None else v
                                    for v in values])
        rv = lib().gnmr_agent_measure(self._a, step, arr)
        if rv != 0:
            bad = [i for i in range(n) if arr[i] < 0]
            raise GnmrError(rv, f"measure for step {step}: " + (
                f"unit {bad[0]}'s value {arr[bad[0]]!r} is negative (a "
                "measure is >= 0, inf, or NaN for none)" if bad else
                "the step must be above the last reported one"))

    def bounds(self):
        """The same-step mode's (step, spare, [bound per unit]) of the
        latest decision (gnmr_agent_bounds: step 0 before any; bounds inf
        where none)."""
        n = self.n_units
        arr = (ctypes.c_float * max(n, 1))()
        spare = ctypes.c_uint32()
        step = lib().gnmr_agent_bounds(self._a, arr, n, ctypes.byref(spare))
        return step, spare.value, list(arr[:n])

    def report_buffers(self, step, buffers):
        """Reports host buffers: (unit, data pointer, element count, dtype
        name) tuples; the library reduces them in fp64 on this thread.
        Units without a buffer are not reported."""
        arr, n = _tensor_array(buffers, self.n_units)
        self._check_report(lib().gnmr_agent_report(self._a, step, arr, n),
                           step)

    def _check_report(self, rv, step):
        if rv == _CLOSED:  # the library says why: a forked child, say
            raise GnmrError(rv, f"report of step {step}: "
                                f"{self.last_error()[1]}")
        _check(rv, f"report of step {step}")

    def wait(self, step, timeout_ms):
        """True once the decision of step is in; False after timeout_ms
        (the routes then come from the fallback rule)."""
        return lib().gnmr_agent_wait(self._a, step, int(timeout_ms)) == 0

    def route(self, unit):
        """True when unit takes the recovery path at the next step."""
        return lib().gnmr_agent_route(self._a, unit) == _lib.ROUTE_HIGH

    def routes_raw(self):
        """Every unit's route from one decision, as bytes (1: recovery
        path), in one call (gnmr_agent_routes)."""
        if self._routes_buf is None:
            self._routes_buf = (ctypes.c_uint8 * self.n_units)()
        n = lib().gnmr_agent_routes(self._a, self._routes_buf, self.n_units)
        return bytes(self._routes_buf)[:n]

    def routes(self):
        """Every unit's route (True: recovery path), from one decision."""
        return [b == _lib.ROUTE_HIGH for b in self.routes_raw()]

    @property
    def decided_step(self):
        return lib().gnmr_agent_decided_step(self._a)

    def risky(self):
        """(step, [(unit, g, d, s), ...]): this agent's units that exceeded
        a threshold at the latest decision, with their GNMR g, Delta-GNMR d
        and score s (local unit indices, ascending); step 0: none yet."""
        n = self.n_units
        units = (ctypes.c_uint32 * n)()
        g, d, s = ((ctypes.c_double * n)() for _ in range(3))
        cnt = ctypes.c_uint32(0)
        step = lib().gnmr_agent_risky(self._a, units, g, d, s, n,
                                      ctypes.byref(cnt))
        k = min(cnt.value, n)
        return step, [(units[i], g[i], d[i], s[i]) for i in range(k)]

    @property
    def joined(self):
        return bool(lib().gnmr_agent_joined(self._a))

    def run(self):
        """(run, last_step) from the Welcome that let this agent in: the
        job's run and the step gnmrd had decided up to (0: a new run);
        None while not joined."""
        run, last = ctypes.c_uint64(), ctypes.c_uint64()
        if not lib().gnmr_agent_run(self._a, ctypes.byref(run),
                                    ctypes.byref(last)):
            return None
        return run.value, last.value

    def last_error(self):
        """(code, message) of gnmrd's last Error reply to this agent: why
        its Hello was refused, say; (0, "") when none."""
        buf = ctypes.create_string_buffer(256)
        code = lib().gnmr_agent_last_error(self._a, buf, len(buf))
        return code, buf.value.decode(errors="replace")

    def stats(self):
        st = _lib.Stats()
        _check(lib().gnmr_agent_stats_get(self._a, ctypes.byref(st)), "stats")
        return {f[0]: getattr(st, f[0]) for f in _lib.Stats._fields_}


def reduce_cpu(buffers, n_units, threads=1):
    """The CPU reduction alone: per-unit (sum of squares, non-finite count)
    of (unit, pointer, numel, dtype name) buffers. threads > 1 spreads it
    over the library's helper threads (0: GNMR_REDUCE_THREADS, else one
    per CPU, at most 8); the sums are the same bit for bit."""
    if threads < 0:
        raise ValueError("threads is 0 (automatic) or more")
    arr, n = _tensor_array(buffers, n_units)
    s = (ctypes.c_double * n_units)()
    nf = (ctypes.c_uint64 * n_units)()
    rv = (lib().gnmr_reduce_cpu(arr, n, n_units, s, nf, None) if threads == 1
          else lib().gnmr_reduce_cpu_threads(arr, n, n_units, s, nf, None,
                                             threads))
    _check(rv, "reduce")
    return list(s), list(nf)


def cuda_device_count():
    """CUDA devices the agent's CUDA backend can use (0: none, no driver,
    or a build without nvcc)."""
    return lib().gnmr_cuda_device_count()


class CudaReducer:
    """The agent's CUDA backend (gnmr/agent_cuda.h) for one Agent and one
    device: after backward, `report(step, buffers, stream)` registers the
    device buffers (uploading the tables only when pointers or sizes
    changed) and launches one fused kernel on `stream` (a cudaStream_t as
    an int, e.g. torch.cuda.current_stream().cuda_stream); the result goes
    to gnmrd from the backend's completion thread, never blocking."""

    def __init__(self, agent, device=0, ring_slots=0, side_stream=False):
        self._c = ctypes.c_void_p()
        self._pid = os.getpid()
        self.agent = agent  # closes after this reducer
        self._registered = None  # the buffers registered last
        cfg = _lib.CudaConfig()
        cfg.device = device
        cfg.ring_slots = ring_slots
        cfg.side_stream = 1 if side_stream else 0
        rv = lib().gnmr_cuda_open(agent._a, ctypes.byref(cfg),
                                  ctypes.byref(self._c))
        _check(rv, f"CUDA backend on device {device}")

    def report(self, step, buffers, stream=0):
        # the same list as last time (the caching allocator hands the
        # gradients the same addresses step after step): registered
        # already, so neither the table nor the call is made again (the
        # library would compare and skip it; building the table was a
        # fifth of step()'s own time on an H200 with 56 units)
        if buffers != self._registered:
            arr, n = _tensor_array(buffers, self.agent.n_units)
            self._registered = None
            self._call(lib().gnmr_cuda_register(self._c, arr, n),
                       "register")
            self._registered = list(buffers)
        self._call(lib().gnmr_cuda_report(self._c, step, stream),
                   f"report of step {step}")

    def report_table(self, step, table, n, stream=0):
        """report() of a table already packed as n gnmr_tensor entries (a
        bytearray or another writable buffer; Reduction's kept table):
        registered every call (the library compares it with the last one
        and uploads it only when it changed), then one launch."""
        arr = (_lib.Tensor * max(n, 1)).from_buffer(table)
        self._registered = None  # report()'s list no longer registered
        self._call(lib().gnmr_cuda_register(self._c, arr, n), "register")
        del arr
        self._call(lib().gnmr_cuda_report(self._c, step, stream),
                   f"report of step {step}")

    def read(self, stream=0):
        """(sumsq, nonfinite, seen) of the last reduction, as lists, copied
        to the host after the work queued on stream (it waits for it: one
        synchronisation)."""
        n = self.agent.n_units
        sumsq = (ctypes.c_double * max(n, 1))()
        nonfinite = (ctypes.c_uint64 * max(n, 1))()
        seen = (ctypes.c_uint8 * max(n, 1))()
        self._call(lib().gnmr_cuda_read(self._c, stream, sumsq, nonfinite,
                                        seen), "read")
        return list(sumsq)[:n], list(nonfinite)[:n], list(seen)[:n]

    def done_event(self):
        """cudaEvent_t (int) recorded after the last report's work."""
        return lib().gnmr_cuda_done_event(self._c)

    def flush(self, timeout_ms=1000):
        return lib().gnmr_cuda_flush(self._c, int(timeout_ms)) == 0

    def stats(self):
        st = _lib.CudaStats()
        _check(lib().gnmr_cuda_stats_get(self._c, ctypes.byref(st)), "stats")
        return {f[0]: getattr(st, f[0]) for f in _lib.CudaStats._fields_}

    def _call(self, rv, what):
        if rv != 0:
            detail = lib().gnmr_cuda_last_error(self._c) or b""
            _check(rv, f"{what}: {detail.decode(errors='replace')}"
                   if detail else what)

    def close(self):
        if self._c and os.getpid() != self._pid:
            # a forked child's copy: the backend's thread and stream are
            # the parent's; leave them be
            self._c = ctypes.c_void_p()
        if self._c:
            lib().gnmr_cuda_close(ctypes.byref(self._c))
            self._c = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
