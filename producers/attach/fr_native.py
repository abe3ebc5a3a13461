"""Flight Recorder's ring read without holding the GIL: torch's exported C++ dump, called through ctypes.

Why: torch's Python binding of the dump (``_dump_fr_trace``) holds the GIL for the whole call. A ring
of 2,000 gloo entries takes 8-22 ms to dump on this 2-core host, one read every 1,400-1,700
collectives, and for all of it a Python training thread cannot run: a thread counting in a loop
beside another that dumped without pause kept 1-20 % of its pace alone. The C++ function the binding
wraps, ``c10d::dump_fr_trace(bool, bool, bool)``, is exported from ``libtorch_cpu`` and touches no
Python object when stack traces are off; ctypes releases the GIL around a foreign call, so the
poller's thread dumps on a core of its own while the training thread goes on (the same counting
thread: 50-70 % of its pace alone on this busy 2-core host). The bytes are the binding's; the CPU is
the same; only the GIL is not taken. The unpickle that follows still holds it (3-5 ms a read).

Narrow on purpose, since a wrong call would crash the job it watches:

- Linux on 64-bit x86 only. The SysV ABI returns a ``std::string`` through a hidden pointer passed as
  the first argument, which ctypes can pass; aarch64 passes it in ``x8``, which ctypes cannot.
- The exact mangled name of the three-``bool`` signature: the name fixes the argument types, and its
  ``[abi:cxx11]`` tag libstdc++'s ``std::string`` (pointer, length, 16-byte inline buffer or capacity).
  A torch whose function takes another argument (newer ones add the backend) has another name: not found.
- Only a ``libtorch_cpu`` already loaded in this process (``RTLD_NOLOAD``), never a second copy.
- Only once a first dump of it is, byte for byte, the binding's (:func:`checked`).
- The string is destroyed by libstdc++'s own exported destructor, so its buffer goes back through the
  same ``operator delete`` that libtorch's allocation came from (a preloaded allocator's included); a
  string whose fields do not look like one is left alone (a leak, never a bad free).
- A fork waits for a dump in progress (:data:`_CALLING`): the dump holds Flight Recorder's mutex while it
  copies the ring, and a child forked then would inherit it locked. Through the binding the GIL kept a
  fork out; here a lock does.

What stays: an exception thrown inside torch's dump (out of memory) cannot cross ctypes and ends the
process where the binding would have raised; and the dump reads the process groups' table without
Flight Recorder's lock, as torch's own dumps from its C++ threads (NCCL's watchdog) do, so a group
created during those microseconds races it as it races them. ``CCLD_FR_NATIVE=0`` turns this off;
anything above that does not hold gives None, and the binding is used, as before.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

ENV_NATIVE = "CCLD_FR_NATIVE"
#: c10d::dump_fr_trace[abi:cxx11](bool includeCollectives, bool includeStackTraces, bool onlyActive)
SYMBOL = "_ZN4c10d13dump_fr_traceB5cxx11Ebbb"
#: std::__cxx11::basic_string<char>::~basic_string(), exported by libstdc++ (libtorch_cpu's dependency)
DESTROY = "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev"
LIBRARY = "libtorch_cpu.so"
_SSO = 15  # libstdc++ keeps up to 15 characters inside the string object itself
_MAX_BYTES = 1 << 31  # a length beyond this is not a dump: the layout is not the one assumed

#: (includeCollectives, includeStackTraces, onlyActive) -> the pickled dump
NativeDumpFn = Callable[[bool, bool, bool], bytes]

#: held around each native dump and by a fork (``os.register_at_fork``): no child is forked while the dump
#: holds Flight Recorder's mutex. Lock.acquire lets go of the GIL while it waits, so the dumping thread can
#: come back from C and release it.
_CALLING = threading.Lock()


def _release_after_fork() -> None:
    if _CALLING.locked():
        _CALLING.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_CALLING.acquire, after_in_parent=_release_after_fork,
                        after_in_child=_release_after_fork)  # fmt: skip


def native_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(ENV_NATIVE, "1").strip().lower() not in ("0", "false", "no", "off")


def supported_platform() -> bool:
    return sys.platform == "linux" and platform.machine() == "x86_64" and ctypes.sizeof(ctypes.c_void_p) == 8


def native_dump(lib: Path | str) -> NativeDumpFn | None:
    """The dump of the loaded library ``lib`` (torch's ``libtorch_cpu``, a path or its soname), called without
    the GIL; None where this platform, that library or its symbols are not the ones this call is written for."""
    if not supported_platform():
        return None
    try:
        handle = ctypes.CDLL(str(lib), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # raises when not loaded
        fn = getattr(handle, SYMBOL)
        destroy = getattr(handle, DESTROY)  # found in the library's dependencies: libstdc++
    except (OSError, AttributeError):
        return None
    # the hidden result pointer first, then the three bools; the return register echoes the pointer
    fn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool, ctypes.c_bool]
    fn.restype = ctypes.c_void_p
    destroy.argtypes = [ctypes.c_void_p]
    destroy.restype = None

    def dump(collectives: bool, stack_traces: bool, only_active: bool) -> bytes:
        out = (ctypes.c_uint64 * 4)()  # std::string: data pointer, length, inline buffer or capacity
        at = ctypes.addressof(out)
        with _CALLING:
            fn(at, collectives, stack_traces, only_active)  # ctypes lets go of the GIL for the call
        data, n, cap = out[0], out[1], out[2]
        inline = data == at + 16
        if not data or n > _MAX_BYTES or (n > _SSO if inline else cap < n):
            # not the layout assumed: leave it (a leak) rather than free what may be no buffer
            raise ValueError(f"Flight Recorder's native dump returned no string ({n} bytes at {data:#x})")
        try:
            return ctypes.string_at(data, n)
        finally:
            destroy(at)

    return dump


def checked(native: NativeDumpFn, bound: Callable[[bool, bool, bool], bytes], tries: int = 3) -> bool:
    """Whether the native dump is the binding's: the two dumps without the ring's entries (a few hundred
    bytes, so the check costs nothing at attach) the same bytes, in one of ``tries`` pairs of reads (a
    collective completing between two reads changes the groups' counters). Any failure: False."""
    for _ in range(tries):
        try:
            if native(False, False, True) == bound(False, False, True):
                return True
        except Exception:  # noqa: BLE001 - not the dump assumed: the binding stays
            return False
    return False


def torch_native_dump(environ: Mapping[str, str], bound: Callable[[bool, bool, bool], bytes] | None
                      ) -> NativeDumpFn | None:  # fmt: skip
    """This process's torch's dump without the GIL when the environment allows it and it is the one ``bound``
    (the binding) gives; else None. The library is looked for in torch's own ``lib`` folder, then by its
    soname among those loaded (a conda torch keeps it elsewhere)."""
    if bound is None or not native_enabled(environ):
        return None
    import torch

    for lib in (Path(torch.__file__).parent / "lib" / LIBRARY, LIBRARY):
        native = native_dump(lib)
        if native is not None:
            return native if checked(native, bound) else None
    return None
