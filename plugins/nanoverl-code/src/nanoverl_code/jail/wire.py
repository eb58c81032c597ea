"""The wire between the program's process and the sandbox: plain data in length-prefixed JSON frames, and
the program's side of it (BOOT). Standard library only: the jail imports it, and the program's interpreter
runs BOOT, assembled from these very functions by `boot_source`, so the format is defined once.

    frame        a 4-byte big-endian length, then that many bytes of JSON
    plain data   None, bool, int, float, str, list, and tagged objects for what JSON lacks:
                 {"__tuple__": [...]}, {"__set__": [...]}, {"__frozenset__": [...]}, {"__bytes__": "hex"},
                 {"__complex__": [re, im]}, {"__dict__": [[k, v], ...]} (keys not all strings, or a dict that
                 looks like a tag); at most MAX_DEPTH levels; floats keep nan and inf
    requests     (checker -> program, fd 4) {"name", "args", "kwargs"}
    replies      (program -> checker or case, fd 5) first {"ready": true}, then per request one of
                 {"value": data}, {"raised": [class name, message]}, {"uncarried": why}

Whatever arrives from the program is untrusted: `recv` and `decode` turn anything malformed (too long, not
JSON, too deep, a bad tag, an unhashable key) into Uncarried, never into another exception.
"""

from __future__ import annotations

import json
import os
import sys

TAGS = ("__tuple__", "__set__", "__frozenset__", "__bytes__", "__complex__", "__dict__")
MAX_DEPTH = 100


class Uncarried(TypeError):
    """A value that is not plain data, or a message that is not a well-formed frame of plain data."""


def encode(value, depth=0):
    """A plain value as JSON-able data (tags for tuples, sets, bytes, complex, non-string keys)."""
    if depth > MAX_DEPTH:
        raise Uncarried("nested too deeply")
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t is list:
        return [encode(x, depth + 1) for x in value]
    if t is tuple:
        return {"__tuple__": [encode(x, depth + 1) for x in value]}
    if t in (set, frozenset):
        return {"__set__" if t is set else "__frozenset__": [encode(x, depth + 1) for x in value]}
    if t is bytes:
        return {"__bytes__": value.hex()}
    if t is complex:
        return {"__complex__": [value.real, value.imag]}
    if t is dict:
        if all(type(k) is str for k in value) and not (len(value) == 1 and next(iter(value)) in TAGS):
            return {k: encode(x, depth + 1) for k, x in value.items()}
        return {"__dict__": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in value.items()]}
    raise Uncarried(f"a value of type {t.__name__} is not plain data")


def decode(data, depth=0):
    """The plain value of decoded JSON data; anything malformed (a bad tag, an unhashable key, too deep) is
    Uncarried, whatever the data holds."""
    if depth > MAX_DEPTH:
        raise Uncarried("nested too deeply")
    t = type(data)
    if data is None or t in (bool, int, float, str):
        return data
    if t is list:
        return [decode(x, depth + 1) for x in data]
    if t is not dict:
        raise Uncarried(f"not plain data: {t.__name__}")
    try:
        if len(data) == 1 and next(iter(data)) in TAGS:
            (tag, x), = data.items()
            if tag == "__bytes__":
                return bytes.fromhex(x)
            if tag == "__complex__":
                re_, im = x
                return complex(float(re_), float(im))
            if type(x) is not list:
                raise Uncarried(f"{tag} holds no list")
            if tag == "__dict__":
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in x}
            items = [decode(y, depth + 1) for y in x]
            return tuple(items) if tag == "__tuple__" else set(items) if tag == "__set__" else frozenset(items)
        return {k: decode(x, depth + 1) for k, x in data.items()}
    except Uncarried:
        raise
    except Exception as exc:  # a malformed tag: bad hex, an unhashable key or member, a wrong arity
        raise Uncarried(f"malformed data ({type(exc).__name__})") from None


def send(fd, obj):
    """One frame: a 4-byte length and the JSON of obj."""
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def recv(fd, limit):
    """The next frame on fd as JSON data (None at end of file). A frame over `limit` bytes, or one that is not
    JSON, is Uncarried."""
    head = b""
    while len(head) < 4:
        chunk = os.read(fd, 4 - len(head))
        if not chunk:
            return None
        head += chunk
    size = int.from_bytes(head, "big")
    if size > limit:
        raise Uncarried(f"a message of {size} bytes is over the output limit")
    body = b""
    while len(body) < size:
        chunk = os.read(fd, min(1 << 20, size - len(body)))
        if not chunk:
            return None
        body += chunk
    try:
        return json.loads(body)
    except Exception:  # not UTF-8, not JSON, nested past the parser's recursion limit
        raise Uncarried("a message that is not JSON") from None


# ---- the program's side: BOOT, run by the program's interpreter ---------------------------------------------
EXIT_COMPILE, EXIT_MEMORY, EXIT_EXEC = 97, 98, 96
"""BOOT's exit statuses: the program does not compile, MemoryError; and the jail's own: exec failed."""


def serve(module, limit):
    """Answer calls of the program's functions: each request {"name", "args", "kwargs"} on fd 4, each reply
    {"value"} / {"raised": [class name, message]} / {"uncarried"} on fd 5, after a first {"ready": true}."""
    send(5, {"ready": True})
    while True:
        try:
            request = recv(4, limit)
        except Uncarried:
            return
        if request is None:
            return
        try:
            owner, _, attr = request["name"].rpartition(".")
            if not owner and not hasattr(module, attr) and hasattr(module, "Solution"):
                owner = "Solution"  # LeetCode style, as verl's prime_code: a method of class Solution
            fn = getattr(getattr(module, owner)(), attr) if owner else getattr(module, attr)
            value = fn(*decode(request["args"]), **decode(request.get("kwargs", {})))
        except MemoryError:
            os._exit(EXIT_MEMORY)
        except Exception as e:
            reply = {"raised": [type(e).__name__, str(e)[:300]]}
        else:
            try:
                reply = {"value": encode(value)}
            except Uncarried as e:
                reply = {"uncarried": str(e)}
        send(5, reply)


def boot():
    """Read the program from fd 3, compile it (97 if it does not), run it as a module; then serve calls."""
    mode, limit = sys.argv[1], int(sys.argv[2])
    source = b""
    while True:
        chunk = os.read(3, 1 << 16)
        if not chunk:
            break
        source += chunk
    os.close(3)
    try:
        code = compile(source, "solution.py", "exec")
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except BaseException as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_COMPILE)
    import types
    module = types.ModuleType("__main__" if mode == "stdio" else "solution")
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)
    except MemoryError:
        os._exit(EXIT_MEMORY)
    if mode != "stdio":
        serve(module, limit)


def boot_source() -> str:
    """BOOT: the program's side as source, from the functions above (one definition of the wire)."""
    import inspect
    parts = [f"import json, os, sys\nTAGS = {TAGS!r}\nMAX_DEPTH = {MAX_DEPTH!r}\n"
             f"EXIT_COMPILE, EXIT_MEMORY = {EXIT_COMPILE!r}, {EXIT_MEMORY!r}\n"]
    parts += [inspect.getsource(obj) for obj in (Uncarried, encode, decode, send, recv, serve, boot)]
    return "\n\n".join(parts) + "\n\nboot()\n"


def message(obj) -> bytes:
    """obj as one frame."""
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


def frame_bytes(data: bytes, skip: int = 0) -> bytes | None:
    """The body of the frame after `skip` frames in a buffer of frames, or None (the buffer ends first)."""
    for _ in range(skip + 1):
        if len(data) < 4:
            return None
        size = int.from_bytes(data[:4], "big")
        body, data = data[4:4 + size], data[4 + size:]
        if len(body) < size:
            return None
    return body


def frame(data: bytes, skip: int = 0) -> dict | None:
    """The frame after `skip` frames as a JSON object, or None (not there, not JSON, not an object)."""
    body = frame_bytes(data, skip)
    try:
        value = json.loads(body) if body is not None else None
    except Exception:
        return None
    return value if isinstance(value, dict) else None
