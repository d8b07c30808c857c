"""A lock in shared memory that a process may die holding: the next process to ask for it gets it, and is told.

multiprocessing's Lock is a POSIX semaphore, which has no owner: a process
killed while holding one leaves it taken for good, and whoever waits for it
waits until they give up.  This is a pthread mutex, shared between
processes and robust (glibc, through ctypes): its word holds its owner's
thread id, which the kernel reads when a thread ends however it ends (its
robust list); a lock whose owner died is marked so and a waiter is woken,
which then holds it (EOWNERDEAD) and marks it usable again.  What the lock
guards must therefore be whole at every instant a holder could die; the
ring's (rnb.engines.local.ring) changes each take one store of one word.

A lock taken from a dead owner is counted in the lock's shared memory
(`recovered`), so that whoever reads it later (a bench, a job's end) can
say so.  `holder` reads the owner's thread id from the lock's word, as the
kernel does; in a single-threaded process that is its pid.

Waiting is in the kernel (a futex), bounded by a timeout on the monotonic
clock; the calls that never block keep the GIL and cost well under a
microsecond, as a semaphore's do.
"""
from __future__ import annotations

import ctypes
import errno
import time
from multiprocessing.context import BaseContext
from typing import Any

_WORDS = 8                 # the mutex: sizeof(pthread_mutex_t) is 40 bytes on x86-64 glibc, 64 leave room
_RECOVERED = _WORDS        # then one word: how many times the lock was taken from a dead owner
_ATTR_BYTES = 16           # sizeof(pthread_mutexattr_t) is 4
_SHARED, _ROBUST = 1, 1    # PTHREAD_PROCESS_SHARED, PTHREAD_MUTEX_ROBUST
_CLOCK_MONOTONIC = time.CLOCK_MONOTONIC
_TID_MASK = 0x3FFFFFFF     # FUTEX_TID_MASK: the owner's thread id in a robust mutex's word


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _functions(library: ctypes.CDLL, names: tuple[str, ...], *args: Any) -> tuple[Any, ...]:
    found = []
    for name in names:
        function = getattr(library, name)
        function.argtypes = [ctypes.c_void_p, *args]
        function.restype = ctypes.c_int
        found.append(function)
    return tuple(found)


_libc = ctypes.CDLL(None)                  # may block: the GIL is released for the call
_at_once = ctypes.PyDLL(None)              # never blocks: no GIL release, no thread switch
_attr_init, _attr_destroy = _functions(_libc, ("pthread_mutexattr_init", "pthread_mutexattr_destroy"))
_set_shared, _set_robust = _functions(_libc, ("pthread_mutexattr_setpshared", "pthread_mutexattr_setrobust"),
                                      ctypes.c_int)
(_init,) = _functions(_libc, ("pthread_mutex_init",), ctypes.c_void_p)
(_clocklock,) = _functions(_libc, ("pthread_mutex_clocklock",), ctypes.c_int, ctypes.POINTER(_Timespec))
_trylock, _unlock, _consistent = _functions(_at_once, ("pthread_mutex_trylock", "pthread_mutex_unlock",
                                                       "pthread_mutex_consistent"))


class RobustLock:
    """A process-shared robust mutex: `acquire(timeout)` then `release()`, from the same thread."""

    def __init__(self, ctx: BaseContext) -> None:
        self._memory = ctx.RawArray("q", _WORDS + 1)
        attr = ctypes.create_string_buffer(_ATTR_BYTES)
        for call, *args in ((_attr_init,), (_set_shared, _SHARED), (_set_robust, _ROBUST)):
            _checked(call(attr, *args))
        _checked(_init(ctypes.addressof(self._memory), attr))
        _attr_destroy(attr)
        self._attach()

    def _attach(self) -> None:
        self._address = ctypes.addressof(self._memory)
        self._words = memoryview(self._memory).cast("B").cast("q")

    def __getstate__(self) -> dict[str, Any]:
        return {"_memory": self._memory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._memory = state["_memory"]
        self._attach()

    def acquire(self, timeout: float = 0.0) -> bool:
        """Take the lock, waiting up to `timeout` seconds; False if it stayed held by a live owner that long.

        A lock whose owner died is taken, counted and made usable again.
        """
        code = _trylock(self._address)
        if code == errno.EBUSY and timeout > 0:
            deadline = time.clock_gettime(_CLOCK_MONOTONIC) + timeout
            seconds = int(deadline)
            code = _clocklock(self._address, _CLOCK_MONOTONIC,
                              ctypes.byref(_Timespec(seconds, int((deadline - seconds) * 1e9))))
        if code == errno.EOWNERDEAD:
            self._words[_RECOVERED] += 1
            code = _consistent(self._address)
        if code in (errno.EBUSY, errno.ETIMEDOUT):
            return False
        _checked(code)
        return True

    def release(self) -> None:
        _checked(_unlock(self._address))

    @property
    def recovered(self) -> int:
        """How many times the lock was taken from an owner that had died holding it."""
        return int(self._words[_RECOVERED])

    def holder(self) -> int | None:
        """The thread id of the lock's owner now (its pid in a single-threaded process); None while it is free."""
        return (int(self._words[0]) & _TID_MASK) or None


def _checked(code: int) -> None:
    if code:
        raise OSError(code, f"pthread mutex: {errno.errorcode.get(code, code)}")
