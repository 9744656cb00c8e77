"""The messages between the checker and the child process that runs a student's file.

Each message is a frame: 8 bytes of length, then the body. The checker sends pickles (its requests, with the
reference caches a student's backward may read). The child, which runs code nobody has read, answers in a
format that cannot run anything when read: a JSON tree whose arrays are ``.npy`` blobs read with
``allow_pickle=False``. It carries None, bools, numbers, strings, tuples, lists, dicts with string keys,
NumPy arrays and scalars (not of dtype object), and ``CacheRef`` (a forward's cache, kept in the child).
Whatever the child writes, the checker reads a reply or a ValueError (a short frame, a bad tree, a bad array):
never another exception. The child reads the checker's pickles without importing the library: an object of
``mha_numpy`` in a request (the reference forward's cache, a ``functional.AttentionCache``) comes back as a
``LibraryObject`` with the same attributes.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import select
import struct
import time
from dataclasses import dataclass

import numpy as np

MAX_FRAME = 1 << 30  # 1 GiB: a longer length is a corrupt frame, not a message
_DEPTH = 32


@dataclass(frozen=True)
class CacheRef:
    """The cache of a forward call, kept in the child; a backward's call sends it back to be looked up."""

    id: int


class Unsendable(Exception):
    """A result the child cannot send: an object that is not made of arrays, numbers, strings and containers."""


def encode(obj) -> bytes:
    """``obj`` as the child's safe format (Unsendable if it holds something else)."""
    blobs: list[bytes] = []
    tree = json.dumps(_tree(obj, blobs, 0)).encode()
    return b"".join([struct.pack(">Q", len(tree)), tree, *(struct.pack(">Q", len(b)) + b for b in blobs)])


def _tree(obj, blobs: list, depth: int):
    if depth > _DEPTH:
        raise Unsendable("nested too deeply")
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int | float) and not isinstance(obj, np.generic):
        return {"number": repr(obj)}  # repr keeps inf, nan and every digit
    if isinstance(obj, np.ndarray | np.generic | complex):
        a = np.asarray(obj)
        if a.dtype.hasobject:
            raise Unsendable("an array of Python objects (dtype object)")
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, a, allow_pickle=False)
        blobs.append(buffer.getvalue())
        return {"array": len(blobs) - 1, "scalar": not isinstance(obj, np.ndarray)}
    if isinstance(obj, CacheRef):
        return {"cache": obj.id}
    if isinstance(obj, tuple | list):
        return {type(obj).__name__: [_tree(x, blobs, depth + 1) for x in obj]}
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return {"dict": [[k, _tree(v, blobs, depth + 1)] for k, v in obj.items()]}
    raise Unsendable(f"a {type(obj).__module__}.{type(obj).__qualname__}")


def decode(data: bytes):
    """The object ``encode`` wrote; ValueError if ``data`` is not such a message (whatever is wrong with it)."""
    try:
        return _decode(data)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - struct.error (a short frame), KeyError, TypeError, RecursionError...
        raise ValueError(f"a malformed reply ({type(e).__name__})") from None


def _decode(data: bytes):
    view = memoryview(data)
    if len(view) < 8:
        raise ValueError(f"a frame of {len(view)} bytes")
    (n,) = struct.unpack(">Q", view[:8])
    tree, offset, blobs = json.loads(bytes(view[8 : 8 + n])), 8 + n, []
    while offset < len(view):
        if offset + 8 > len(view):
            raise ValueError("a truncated array length")
        (m,) = struct.unpack(">Q", view[offset : offset + 8])
        blobs.append(np.lib.format.read_array(io.BytesIO(view[offset + 8 : offset + 8 + m]), allow_pickle=False))
        offset += 8 + m
    return _object(tree, blobs)


def _object(tree, blobs: list):
    if tree is None or isinstance(tree, bool | str):
        return tree
    if not isinstance(tree, dict):
        raise ValueError(f"not a message: {type(tree).__name__}")
    if "number" in tree:
        return _number(tree["number"])
    if "array" in tree:
        a = blobs[tree["array"]]
        return a[()] if tree.get("scalar") else a
    if "cache" in tree:
        return CacheRef(int(tree["cache"]))
    if "tuple" in tree or "list" in tree:
        items = [_object(x, blobs) for x in tree.get("tuple", tree.get("list"))]
        return tuple(items) if "tuple" in tree else items
    if "dict" in tree:
        return {str(k): _object(v, blobs) for k, v in tree["dict"]}
    raise ValueError(f"not a message: keys {sorted(tree)}")


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


def write_frame(fd: int, body: bytes) -> None:
    """Write one frame (its length, then ``body``) to the file descriptor ``fd``."""
    data = memoryview(struct.pack(">Q", len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def read_frame(fd: int, deadline: float | None = None) -> bytes:
    """Read one frame from ``fd``: TimeoutError when ``deadline`` (time.monotonic) passes first, EOFError when
    the other side closed the pipe, ValueError for an impossible length."""
    (n,) = struct.unpack(">Q", _read(fd, 8, deadline))
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes")
    return _read(fd, n, deadline)


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_request(fd: int, request) -> None:
    """The checker's side: a pickled request."""
    write_frame(fd, pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))


class LibraryObject:
    """An object of the library in the checker's request, rebuilt in the child without importing the library:
    its attributes (a dataclass's fields) only, under its class's name."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(vars(self))})"


_STANDINS: dict[tuple[str, str], type] = {}


class _Requests(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.split(".")[0] != "mha_numpy":
            return super().find_class(module, name)
        if (module, name) == ("mha_numpy.checker.protocol", "CacheRef"):
            return CacheRef  # this module's, under the name the child loaded it with
        if (module, name) not in _STANDINS:
            _STANDINS[module, name] = type(name, (LibraryObject,), {"__module__": "checker", "__qualname__": name})
        return _STANDINS[module, name]


def read_request(fd: int):
    """The child's side: the checker's next request (the child trusts the checker; it imports no mha_numpy)."""
    return _Requests(io.BytesIO(read_frame(fd))).load()


def send_reply(fd: int, reply) -> None:
    """The child's side: a reply in the safe format."""
    write_frame(fd, encode(reply))


def read_reply(fd: int, deadline: float):
    """The checker's side: the child's next reply, read without running anything (ValueError if malformed)."""
    return decode(read_frame(fd, deadline))
