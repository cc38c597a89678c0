# SPDX-License-Identifier: MIT
"""ctypes declarations of libgnmr-agent (include/gnmr/agent.h).

The library is found, in order, at $GNMR_AGENT_LIB, next to this package
(gnmr/libgnmr-agent.so), in ../../build/lib of a source checkout, or by the
system's loader (libgnmr-agent.so.0 from `make install`).
"""
import ctypes
import ctypes.util
import os

from ._params import PARAMS

ROUTE_LOW, ROUTE_HIGH = 0, 1
START_ANY, START_FRESH, START_RESUME = 0, 1, 2
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64 = 0, 1, 2, 3
DTYPE_F8E4M3, DTYPE_F8E5M2 = 4, 5


class Params(ctypes.Structure):
    """gnmr_params: the job's policy parameters (docs/policy.md), laid out
    from the parameter table (_params.py, generated from gnmr/params.h)."""
    _fields_ = [(name, getattr(ctypes, ctype))
                for name, ctype, *_rest in PARAMS]


class AgentConfig(ctypes.Structure):
    _fields_ = [
        ("endpoint", ctypes.c_char_p),
        ("job", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("reporters", ctypes.c_uint32),
        ("unit_names", ctypes.POINTER(ctypes.c_char_p)),
        ("n_units", ctypes.c_uint32),
        ("unit_ids", ctypes.POINTER(ctypes.c_uint32)),
        ("params", Params),
        ("barrier_ms", ctypes.c_uint32),
        ("fallback_route", ctypes.c_uint32),
        ("fallback_after", ctypes.c_uint32),
        ("observer", ctypes.c_uint32),
        ("curve_server_key", ctypes.c_char_p),
        ("curve_public_key", ctypes.c_char_p),
        ("curve_secret_key", ctypes.c_char_p),
        ("start", ctypes.c_uint32),
        ("node_ranks", ctypes.c_uint32),
    ]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("numel", ctypes.c_uint64),
        ("dtype", ctypes.c_uint32),
        ("unit", ctypes.c_uint32),
        ("scale", ctypes.c_double),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("reports_sent", ctypes.c_uint64),
        ("reports_dropped", ctypes.c_uint64),
        ("decisions", ctypes.c_uint64),
        ("late_decisions", ctypes.c_uint64),
        ("fallback_routes", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("hellos", ctypes.c_uint64),
        ("last_error", ctypes.c_int32),
        ("reports_stale", ctypes.c_uint64),
        ("decisions_fenced", ctypes.c_uint64),
    ]


RESULT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64,
                             ctypes.POINTER(ctypes.c_double),
                             ctypes.POINTER(ctypes.c_uint64),
                             ctypes.POINTER(ctypes.c_uint8), ctypes.c_uint32)


class CudaConfig(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int),
        ("n_units", ctypes.c_uint32),
        ("ring_slots", ctypes.c_uint32),
        ("side_stream", ctypes.c_uint32),
        ("grid_blocks", ctypes.c_uint32),
        ("on_result", RESULT_FN),
        ("on_result_ctx", ctypes.c_void_p),
    ]


class CudaStats(ctypes.Structure):
    _fields_ = [
        ("launches", ctypes.c_uint64),
        ("reports", ctypes.c_uint64),
        ("delivered", ctypes.c_uint64),
        ("skipped_steps", ctypes.c_uint64),
        ("uploads", ctypes.c_uint64),
        ("cuda_errors", ctypes.c_uint64),
        ("grid", ctypes.c_uint32),
        ("chunks", ctypes.c_uint32),
    ]


def candidates():
    """Where the library is looked for, in order."""
    env = os.environ.get("GNMR_AGENT_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for cand in (os.path.join(here, "libgnmr-agent.so"),
                 # a source checkout: python/gnmr -> build/lib
                 os.path.join(here, "..", "..", "build", "lib",
                              "libgnmr-agent.so"),
                 # `make install PREFIX=P`: P/lib/python3*/*-packages/gnmr
                 # -> P/lib
                 os.path.join(here, "..", "..", "..", "libgnmr-agent.so.0")):
        if os.path.exists(cand):
            found.append(os.path.normpath(cand))
    found.append(ctypes.util.find_library("gnmr-agent") or
                 "libgnmr-agent.so.0")
    return found


class LibraryNotFound(ImportError):
    """libgnmr-agent could not be loaded; the message says how to fix it."""


def default_endpoint():
    """gnmrd's own default agent endpoint (gnmrd --help), unless
    GNMR_ENDPOINT says otherwise: ipc://RUN/agents.sock, RUN being
    $RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/gnmr, else /tmp/gnmr-UID. A
    gnmrd run by systemd (systemd/gnmrd.service) listens on
    ipc:///run/gnmr/agents.sock: set GNMR_ENDPOINT to that."""
    if os.environ.get("GNMR_ENDPOINT"):
        return os.environ["GNMR_ENDPOINT"]
    if os.environ.get("RUNTIME_DIRECTORY"):
        run = os.environ["RUNTIME_DIRECTORY"]
    elif os.environ.get("XDG_RUNTIME_DIR"):
        run = os.path.join(os.environ["XDG_RUNTIME_DIR"], "gnmr")
    else:
        run = f"/tmp/gnmr-{os.getuid()}"
    return f"ipc://{run}/agents.sock"


def load():
    """Loads the library and declares the signatures of its functions;
    LibraryNotFound (an ImportError) names every place tried and the fix."""
    tried, lib = [], None
    for path in candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        # a library older than this package lacks its newer calls: say so
        # here rather than as an AttributeError at the first step
        missing = [n for n in _signatures() if not hasattr(lib, n)]
        if not missing:
            break
        tried.append(f"{path} (lacks {', '.join(missing[:4])}"
                     f"{' and more' if len(missing) > 4 else ''}: older "
                     "than this gnmr package, or not libgnmr-agent)")
        lib = None
    if lib is None:
        raise LibraryNotFound(
            "libgnmr-agent could not be loaded; tried: " + "; ".join(tried) +
            ". Build it (`make` in the GNMR checkout) and set "
            "GNMR_AGENT_LIB=/path/to/build/lib/libgnmr-agent.so, or "
            "`make install` and use the Python that install names")
    for name, (res, args) in _signatures().items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _signatures():
    """{name: (result type, argument types)} of every call the package
    makes."""
    P = ctypes.POINTER
    agent_p = ctypes.c_void_p
    sigs = {
        "gnmr_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "gnmr_errname": (ctypes.c_char_p, [ctypes.c_int]),
        "gnmr_params_default": (None, [P(Params)]),
        "gnmr_agent_config_from_env": (ctypes.c_int,
                                       [P(AgentConfig),
                                        P(ctypes.c_char_p)]),
        "gnmr_agent_open": (ctypes.c_int, [P(AgentConfig), P(agent_p)]),
        "gnmr_endpoint_check": (ctypes.c_int, [ctypes.c_char_p,
                                               ctypes.c_char_p,
                                               ctypes.c_size_t]),
        "gnmr_agent_close": (None, [P(agent_p)]),
        "gnmr_agent_report": (ctypes.c_int, [agent_p, ctypes.c_uint64,
                                             P(Tensor), ctypes.c_size_t]),
        "gnmr_agent_report_sums": (ctypes.c_int,
                                   [agent_p, ctypes.c_uint64,
                                    P(ctypes.c_double), P(ctypes.c_uint64),
                                    P(ctypes.c_uint8)]),
        "gnmr_agent_report_sums_shadowed": (
            ctypes.c_int, [agent_p, ctypes.c_uint64, P(ctypes.c_double),
                           P(ctypes.c_uint64), P(ctypes.c_uint8),
                           P(ctypes.c_uint8)]),
        "gnmr_agent_measure": (ctypes.c_int, [agent_p, ctypes.c_uint64,
                                              P(ctypes.c_double)]),
        "gnmr_agent_bounds": (ctypes.c_uint64, [agent_p, P(ctypes.c_float),
                                                ctypes.c_uint32,
                                                P(ctypes.c_uint32)]),
        "gnmr_agent_wait": (ctypes.c_int, [agent_p, ctypes.c_uint64,
                                           ctypes.c_int]),
        "gnmr_agent_route": (ctypes.c_int, [agent_p, ctypes.c_uint32]),
        "gnmr_agent_routes": (ctypes.c_uint32, [agent_p, P(ctypes.c_uint8),
                                                ctypes.c_uint32]),
        "gnmr_agent_decided_step": (ctypes.c_uint64, [agent_p]),
        "gnmr_agent_risky": (ctypes.c_uint64,
                             [agent_p, P(ctypes.c_uint32),
                              P(ctypes.c_double), P(ctypes.c_double),
                              P(ctypes.c_double), ctypes.c_uint32,
                              P(ctypes.c_uint32)]),
        "gnmr_agent_joined": (ctypes.c_int, [agent_p]),
        "gnmr_agent_run": (ctypes.c_int, [agent_p,
                                          ctypes.POINTER(ctypes.c_uint64),
                                          ctypes.POINTER(ctypes.c_uint64)]),
        "gnmr_agent_stats_get": (ctypes.c_int, [agent_p, P(Stats)]),
        "gnmr_agent_last_error": (ctypes.c_int, [agent_p, ctypes.c_char_p,
                                                 ctypes.c_size_t]),
        "gnmr_reduce_cpu": (ctypes.c_int, [P(Tensor), ctypes.c_size_t,
                                           ctypes.c_uint32,
                                           P(ctypes.c_double),
                                           P(ctypes.c_uint64),
                                           P(ctypes.c_uint8)]),
        "gnmr_reduce_cpu_threads": (ctypes.c_int,
                                    [P(Tensor), ctypes.c_size_t,
                                     ctypes.c_uint32, P(ctypes.c_double),
                                     P(ctypes.c_uint64), P(ctypes.c_uint8),
                                     ctypes.c_uint]),
        "gnmr_cuda_device_count": (ctypes.c_int, []),
        "gnmr_cuda_open": (ctypes.c_int, [agent_p, P(CudaConfig),
                                          P(ctypes.c_void_p)]),
        "gnmr_cuda_close": (None, [P(ctypes.c_void_p)]),
        "gnmr_cuda_register": (ctypes.c_int, [ctypes.c_void_p, P(Tensor),
                                              ctypes.c_size_t]),
        "gnmr_cuda_report": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64,
                                            ctypes.c_void_p]),
        "gnmr_cuda_read": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                          P(ctypes.c_double),
                                          P(ctypes.c_uint64),
                                          P(ctypes.c_uint8)]),
        "gnmr_cuda_flush": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
        "gnmr_cuda_done_event": (ctypes.c_void_p, [ctypes.c_void_p]),
        "gnmr_cuda_stats_get": (ctypes.c_int, [ctypes.c_void_p,
                                               P(CudaStats)]),
        "gnmr_cuda_last_error": (ctypes.c_char_p, [ctypes.c_void_p]),
    }
    return sigs
