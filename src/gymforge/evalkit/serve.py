"""The submission's side of gymforge's evaluation channel: answers the scorer's calls with JSON values.

Usage: python -I serve.py CHANNEL_DIR   (cwd: the agent's workspace, read-only; no answers in this sandbox)

Listens on CHANNEL_DIR/submission.sock for one connection. Requests are pickled by the scorer (trusted);
replies are JSON, so nothing this process (the agent's code) sends can run in the scorer. Whatever the
agent's code prints goes to this sandbox's output, which the agent sees. Ends when the scorer disconnects
or the host writes CHANNEL_DIR/done.
"""

import importlib
import json
import os
import pickle
import random
import socket
import struct
import sys
import threading
import time
import traceback

_objects = {}


def _plain(value, depth=0):
    if depth > 64:
        raise TypeError("nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, pandas Series and Index
    if callable(tolist) and type(value).__module__.split(".")[0] in ("numpy", "pandas"):
        return _plain(tolist(), depth + 1)
    raise TypeError(type(value).__name__)


def _reply(value):
    try:
        return {"value": _plain(value)}
    except TypeError:
        handle = len(_objects) + 1
        _objects[handle] = value
        return {"handle": handle, "callable": "1" if callable(value) else "0"}


def _handle(request):
    op = request.get("op")
    if op == "import":
        return _reply(importlib.import_module(request["module"]))
    if op == "load_pickle":
        with open(request["path"], "rb") as f:
            return _reply(pickle.load(f))
    target = _objects[request["handle"]]
    if op == "getattr":
        return _reply(getattr(target, request["name"]))
    if op == "call":
        if "random" in request:
            random.setstate(request["random"])
        if "np_random" in request:
            import numpy

            numpy.random.set_state(request["np_random"])
        return _reply(target(*request["args"], **request["kwargs"]))
    raise ValueError(f"unknown request {op!r}")


def _recv_exact(conn, n):
    # gymforge_eval has its own (raising where this returns None): this file runs as `python -I serve.py` in
    # the submission's sandbox, where the script's folder is not on sys.path, so it imports nothing of ours.
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _address(path):
    """An address for a socket at `path` that fits AF_UNIX's 108 bytes: without bubblewrap the channel lies deep
    in the host's results directory, so a long path is reached through a descriptor of its directory."""
    if len(os.fsencode(path)) < 100:
        return path
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)  # kept open: the address names it
    return f"/proc/self/fd/{folder}/{os.path.basename(path)}"


def _watch(done):
    while not os.path.exists(done):
        time.sleep(0.02)
    os._exit(0)


def main():
    channel = sys.argv[1]
    sys.path.insert(0, os.getcwd())  # `import <module>` finds the workspace's modules, as under MLGym
    threading.Thread(target=_watch, args=(os.path.join(channel, "done"),), daemon=True).start()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(channel, "submission.sock")
    tmp = path + f".{os.getpid()}"
    server.bind(_address(tmp))
    os.chmod(tmp, 0o666)  # the scorer's sandbox may run as another user
    server.listen(1)
    os.rename(tmp, path)  # appears only once it accepts connections
    conn, _ = server.accept()
    server.close()
    while True:
        head = _recv_exact(conn, 8)
        if head is None:
            return
        body = _recv_exact(conn, struct.unpack(">Q", head)[0])
        if body is None:
            return
        try:
            reply = _handle(pickle.loads(body))
        except Exception as exc:  # noqa: BLE001 - the submission's errors go back to the scorer by class
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply, allow_nan=True).encode()
        conn.sendall(struct.pack(">Q", len(data)) + data)


if __name__ == "__main__":
    main()
