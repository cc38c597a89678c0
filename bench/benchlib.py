# SPDX-License-Identifier: MIT
"""bench/benchlib.py — what the Python benchmarks share: a gnmrd of their
own, and the model of the torch benchmarks."""
import os
import re
import subprocess
import sys
import tempfile
import time


def start_gnmrd(name):
    """Starts gnmrd (from GNMR_BIN_DIR, else build/bin) on a free loopback
    port, its data and admin socket in a new temporary directory. Returns
    (process, agents endpoint, directory); exits saying so when gnmrd
    does not print its endpoint."""
    bindir = os.environ.get("GNMR_BIN_DIR", "build/bin")
    tmp = tempfile.mkdtemp(prefix=f"gnmr-bench-{name}-")
    d = subprocess.Popen([os.path.join(bindir, "gnmrd"), "--data-dir",
                          tmp + "/data", "--agents", "tcp://127.0.0.1:*",
                          "--admin", f"ipc://{tmp}/admin.sock",
                          "--log-level", "warn"],
                         stdout=subprocess.PIPE, text=True)
    for line in d.stdout:
        m = re.match(r"gnmrd: agents (\S+)", line)
        if m:
            return d, m.group(1), tmp
    d.wait()
    sys.exit(f"{name}: gnmrd ({bindir}/gnmrd) did not start")


def mlp():
    """12 Linear layers of 512x512 with GELU, then 512 -> 10: 13 units,
    13.6 MB of fp32 gradients. The same weights every call."""
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))


class RawEcho:
    """Raw ZeroMQ, the floor of one round trip to another process: a
    DEALER here, and a ROUTER in a child process that libzmq's own proxy
    turns around (zmq_proxy with the socket as both its ends sends each
    message back to its sender, in C), over loopback TCP as the agent
    talks to gnmrd. round_trip() sends `size` bytes and waits for them,
    spinning first as the agent's wait does."""

    def __init__(self, size=256):
        import ctypes
        z = self._z = ctypes.CDLL("libzmq.so.5")
        vp, ci = ctypes.c_void_p, ctypes.c_int
        z.zmq_ctx_new.restype = vp
        z.zmq_socket.restype, z.zmq_socket.argtypes = vp, [vp, ci]
        z.zmq_connect.argtypes = [vp, ctypes.c_char_p]
        z.zmq_send.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, ci]
        z.zmq_recv.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, ci]
        z.zmq_setsockopt.argtypes = [vp, ci, vp, ctypes.c_size_t]
        z.zmq_close.argtypes = [vp]
        z.zmq_ctx_term.argtypes = [vp]
        self.child = subprocess.Popen([sys.executable, "-c", _ECHO],
                                      stdout=subprocess.PIPE, text=True)
        ep = self.child.stdout.readline().strip()
        if not ep.startswith("tcp://"):
            self.child.kill()
            sys.exit(f"RawEcho: the echo process printed {ep!r}")
        self._ctx = z.zmq_ctx_new()
        self._s = z.zmq_socket(self._ctx, 5)  # ZMQ_DEALER
        zero = ctypes.c_int(0)
        z.zmq_setsockopt(self._s, 17, ctypes.byref(zero), 4)  # ZMQ_LINGER
        if z.zmq_connect(self._s, ep.encode()) != 0:
            sys.exit(f"RawEcho: cannot connect to {ep}")
        self.size, self._msg = size, bytes(size)
        self._buf = ctypes.create_string_buffer(size + 64)
        self.round_trip()

    def round_trip(self, spin_s=0.002):
        """As the agent waits for a decision: polls, yielding the CPU,
        for up to spin_s (GNMR_WAIT_SPIN_US's default), then blocks."""
        z, want = self._z, len(self._msg)
        z.zmq_send(self._s, self._msg, want, 0)
        end = time.perf_counter() + spin_s
        while True:
            n = z.zmq_recv(self._s, self._buf, len(self._buf), 1)  # DONTWAIT
            if n >= 0 or time.perf_counter() >= end:
                break
            os.sched_yield()
        if n < 0:
            n = z.zmq_recv(self._s, self._buf, len(self._buf), 0)
        if n != want:
            sys.exit("RawEcho: the echo came back short")

    def close(self):
        self.child.kill()
        self.child.wait()
        self.child.stdout.close()
        self._z.zmq_close(self._s)
        self._z.zmq_ctx_term(self._ctx)


_ECHO = r"""
import ctypes, sys
ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: ends with us
z = ctypes.CDLL("libzmq.so.5")
vp = ctypes.c_void_p
z.zmq_ctx_new.restype = vp
z.zmq_socket.restype, z.zmq_socket.argtypes = vp, [vp, ctypes.c_int]
z.zmq_bind.argtypes = [vp, ctypes.c_char_p]
z.zmq_getsockopt.argtypes = [vp, ctypes.c_int, vp, vp]
z.zmq_proxy.argtypes = [vp, vp, vp]
s = z.zmq_socket(z.zmq_ctx_new(), 6)  # ZMQ_ROUTER
if z.zmq_bind(s, b"tcp://127.0.0.1:*") != 0:
    sys.exit("bind failed")
buf, n = ctypes.create_string_buffer(256), ctypes.c_size_t(256)
z.zmq_getsockopt(s, 32, buf, ctypes.byref(n))  # ZMQ_LAST_ENDPOINT
print(buf.value.decode(), flush=True)
z.zmq_proxy(s, s, None)
"""
