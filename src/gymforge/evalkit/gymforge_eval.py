"""Reach a submission that runs in a sandbox of its own (gymforge's evaluation contract).

An evaluation script that scores agent code (a Python module, a pickled model) must not run that code in
its own process: the code could print a metrics line, patch the scorer or read the answers. Under gymforge
the script imports this module instead and gets proxies: calls go to the submission's sandbox (the agent's
workspace, read-only, no answers), arguments pickled in, results back as JSON values only (numbers,
strings, lists, dicts; numpy and pandas values arrive as lists). Objects that are not JSON values come back
as further proxies. Under MLGym this module does not exist, so scripts fall back to a plain import:

    try:
        from gymforge_eval import import_submission, load_pickle
    except ImportError:  # MLGym: the submission runs in this process
        import importlib, pickle
        import_submission = importlib.import_module
        def load_pickle(path):
            with open(path, "rb") as f:
                return pickle.load(f)
"""

import json
import os
import pickle
import random
import socket
import struct
import sys
import time

MAX_REPLY = 512 << 20
_conn = None
_shared = {}  # generator states both processes hold (the submission keeps its own between calls)


class SubmissionError(Exception):
    """The submission's code raised, or returned something that is not a JSON value."""


def _address(path):
    """serve.py's `_address`, on this side (each file runs alone): a path past AF_UNIX's 108 bytes (the channel of a
    sandbox without bubblewrap) is reached through a descriptor of its directory."""
    if len(os.fsencode(path)) < 100:
        return path
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{folder}/{os.path.basename(path)}"


def _connect():
    global _conn
    if _conn is None:
        address = _address(os.path.join(os.environ.get("GYMFORGE_CHANNEL", "/gymforge-channel"), "submission.sock"))
        deadline = time.monotonic() + float(os.environ.get("GYMFORGE_SUBMISSION_WAIT", "300"))
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(address)
                break
            except OSError:
                s.close()
                if time.monotonic() > deadline:
                    raise SubmissionError("the submission's sandbox did not start") from None
                time.sleep(0.005)
        _conn = s
    return _conn


def _recv_exact(s, n):
    # serve.py has its own: it runs in the submission's sandbox as `python -I serve.py` and cannot import this.
    chunks = []
    while n:
        chunk = s.recv(min(n, 1 << 20))
        if not chunk:
            raise SubmissionError("the submission's process ended (it crashed or exited)")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _ask(request):
    s = _connect()
    data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    s.sendall(struct.pack(">Q", len(data)) + data)
    (size,) = struct.unpack(">Q", _recv_exact(s, 8))
    if size > MAX_REPLY:
        raise SubmissionError(f"the submission's reply is too large ({size} bytes)")
    reply = json.loads(_recv_exact(s, size))  # JSON only: nothing the submission sends can run here
    if not isinstance(reply, dict):
        raise SubmissionError("malformed reply from the submission's sandbox")
    if "error" in reply:
        raise SubmissionError(str(reply["error"])[:2000])
    if "handle" in reply:
        return _Remote(int(reply["handle"]), str(reply.get("callable", "")) == "1")
    return reply.get("value")


class _Remote:
    """An object that lives in the submission's sandbox: attributes and calls are forwarded there."""

    def __init__(self, handle, is_callable):
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_callable", is_callable)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _ask({"op": "getattr", "handle": self._handle, "name": name})

    def __call__(self, *args, **kwargs):
        # Under MLGym an evaluation that seeds the global `random` (or numpy) generator seeds the submission
        # too. So a state the scorer set since the last call goes with the call; otherwise the submission
        # goes on with its own stream. Nothing comes back: the submission never sets the scorer's generators.
        request = {"op": "call", "handle": self._handle, "args": args, "kwargs": kwargs}
        if (state := random.getstate()) != _shared.get("random"):
            request["random"] = _shared["random"] = state
        np = sys.modules.get("numpy")
        if np is not None:
            np_state = np.random.get_state()
            key = (np_state[1].tobytes(), np_state[2:])
            if key != _shared.get("np_random"):
                request["np_random"], _shared["np_random"] = np_state, key
        return _ask(request)


def import_submission(module):
    """The submission's module `module` (e.g. "coloring"), imported in its own sandbox."""
    return _ask({"op": "import", "module": str(module)})


def load_pickle(path):
    """The object pickled at `path` (relative to the workspace), unpickled in the submission's sandbox."""
    return _ask({"op": "load_pickle", "path": str(path)})
