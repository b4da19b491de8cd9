"""Recycled buffers for the bytes the caches keep, outside the C heap.

Owns ``BufferPool``: buffers of at least ``smallest`` bytes, each one slot of
its own anonymous ``mmap``, handed out as writable ``memoryview``s and used
again once nobody holds them. The caches keep their blocks and decoded
chunks in such buffers instead of ``bytes`` from ``malloc``, for two reasons
measured on the test VM (``docs/benchmarks.md``, "Where the memory goes"):

- megabytes kept for minutes (cached blocks, decoded chunks) interleaved in
  glibc's heap with megabytes kept for milliseconds (S3 bodies, replies)
  fragment it, and the daemon's RSS grew about 200 MiB past what its caches
  and requests held;
- handing freed memory back to the kernel instead is slow here: a page
  touched again after that costs about 2 s per GiB.

A slot keeps its pages while it waits in the pool, so a buffer taken again
costs no fresh pages. Slot sizes are classes (four per power of two, whole
pages), so a buffer costs at most a quarter more than asked; or, for a pool
made with one ``slot`` size (the block cache's: every block but an object's
last is that size, and a last one of any size must not need a class of its
own), every slot is that size. ``charge`` is what a buffer of some length
costs (its slot), the figure the caches count against their budgets.

Ownership: ``take`` returns a view that exports the slot through an object
of its own (a ``ctypes`` array over the ``mmap``); every view derived from
it (slices, ``numpy.frombuffer``, ``memoryview.cast``) holds that object,
and the slot goes back to the pool only when the last of them is gone (a
``weakref.finalize`` on it). So a cache may drop a buffer at any time: a
reader still holding a view keeps it, and the pool counts it as in use
(``in_use``) until then. Nothing is ever written into a slot while a view of
it exists, so no reader sees its bytes change.

Memory: ``resident`` is the bytes of every slot mapped, in use or waiting.
A slot given back while ``resident`` is over ``limit`` is unmapped at once
(its pages are dropped with ``madvise(MADV_DONTNEED)``, which works while
the dying exporter still holds the map); ``take`` drops waiting slots of other
classes to stay within ``limit`` before it maps a new one. ``take`` never
fails for want of room: past ``limit`` it maps more, and ``over`` counts the
bytes mapped beyond the limit at the worst moment (``peak_over``).

Concurrency: ``take`` may be called from any thread (decoders run in
worker threads) and a slot is given back in whichever thread dropped the
last view of it; one ``threading.RLock`` guards the free lists and
counters, held for no I/O and no system call but ``mmap``/``madvise``. It
is reentrant because a slot may be given back inside ``take`` itself: the
cyclic garbage collector can run at any allocation and free the last view
of another slot. Every change under it is therefore one complete step
(``setdefault`` then ``append``), never a list taken out and put back.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import threading
import weakref
from collections import OrderedDict

#: Buffers smaller than this stay ``bytes`` on the heap (by default; ``smallest``).
POOLED_MIN = 256 << 10
#: Size classes per power of two.
CLASSES_PER_DOUBLING = 4


def private_map(nbytes: int) -> mmap.mmap:
    """``nbytes`` of private anonymous memory. Python's default for ``mmap(-1, ...)``
    is a shared mapping, whose pages come from shmem and cost about a third more to
    touch the first time (1.1-1.3 s per GiB against 0.76-0.94 on the test VM)."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def size_class(nbytes: int) -> int:
    """The slot size that holds ``nbytes``: the smallest of four steps per power of
    two (whole pages) that is at least ``nbytes``."""
    if nbytes <= mmap.PAGESIZE:
        return mmap.PAGESIZE
    top = 1 << (nbytes - 1).bit_length()  # the power of two at or above
    step = max(top // (2 * CLASSES_PER_DOUBLING), mmap.PAGESIZE)
    return -(-nbytes // step) * step


def charge(nbytes: int, smallest: int = POOLED_MIN) -> int:
    """What holding ``nbytes`` costs: its slot's size when pooled (at least
    ``smallest``), else ``nbytes``."""
    return size_class(nbytes) if nbytes >= smallest else nbytes


@functools.lru_cache(maxsize=256)
def _exporter(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    """A ctypes array type of ``nbytes`` chars: its instances export a slot."""
    return ctypes.c_char * nbytes


class BufferPool:
    """Buffers of at least ``smallest`` bytes in recycled ``mmap`` slots, about
    ``limit`` bytes of them mapped at most (see the module docstring)."""

    def __init__(self, limit: int, smallest: int = POOLED_MIN, slot: int | None = None) -> None:
        self.limit = limit
        self.smallest = smallest
        #: The one slot size of the pool (buffers of at most that many bytes), or None
        #: for size classes.
        self.slot = slot
        self._lock = threading.RLock()
        #: Waiting slots by class, the class used last at the end.
        self._free: OrderedDict[int, list[mmap.mmap]] = OrderedDict()
        #: Bytes of slots mapped (in use or waiting), and of those in use.
        self.resident = 0
        self.in_use = 0
        #: The most bytes mapped beyond ``limit`` at once.
        self.peak_over = 0
        #: Buffers taken, of those served by a waiting slot, slots unmapped.
        self.taken = 0
        self.reused = 0
        self.unmapped = 0

    def pooled(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` comes from the pool (else it stays ``bytes``)."""
        return nbytes >= self.smallest

    def charge(self, nbytes: int) -> int:
        """What holding ``nbytes`` costs here: its slot when pooled, else ``nbytes``."""
        return self._slot_for(nbytes) if nbytes >= self.smallest else nbytes

    def _slot_for(self, nbytes: int) -> int:
        if self.slot is None or nbytes > self.slot:
            return size_class(nbytes)
        return self.slot

    @property
    def over(self) -> int:
        """Bytes mapped beyond ``limit`` now."""
        return max(0, self.resident - self.limit)

    def take(self, nbytes: int) -> memoryview:
        """A writable view of ``nbytes`` (at least ``smallest``) in a slot of its own;
        the slot goes back to the pool when the last view derived from it is gone."""
        size = self._slot_for(nbytes)
        with self._lock:
            self.taken += 1
            waiting = self._free.get(size)
            if waiting:
                slot = waiting.pop()
                self.reused += 1
            else:
                self._make_room(size)
                slot = private_map(size)
                self.resident += size
                self.peak_over = max(self.peak_over, self.over)
            self.in_use += size
        owner = _exporter(nbytes).from_buffer(slot)
        owner.pool = self  # type: ignore[attr-defined]  # see ``owns``
        weakref.finalize(owner, self._give_back, size, slot)
        return memoryview(owner).cast("B")

    def buffer(self, nbytes: int) -> bytearray | memoryview:
        """A writable buffer of ``nbytes``: pooled when it is large enough, else a
        ``bytearray`` (``layouts.decoding.OUTPUT`` for decoders that write in place)."""
        return self.take(nbytes) if self.pooled(nbytes) else bytearray(nbytes)

    def owns(self, data: bytes | bytearray | memoryview) -> bool:
        """Whether ``data`` is a view of a buffer this pool handed out."""
        return isinstance(data, memoryview) and getattr(data.obj, "pool", None) is self

    def copy(self, data: bytes | bytearray | memoryview) -> bytes | memoryview:
        """``data`` in a pooled buffer when it is large enough, else as ``bytes`` of
        its own (never a view that would keep the buffer it was cut from)."""
        if not self.pooled(len(data)):
            return data if isinstance(data, bytes) else bytes(data)
        buf = self.take(len(data))
        buf[:] = data
        return buf

    def keep(self, data: bytes | bytearray | memoryview) -> bytes | memoryview:
        """``data`` as a cache keeps it: itself if it is a buffer this pool handed
        out, else ``copy``."""
        if isinstance(data, memoryview) and self.owns(data):
            return data
        return self.copy(data)

    def trim(self) -> None:
        """Unmap waiting slots until the pool is within ``limit`` or none wait: for a
        limit just lowered."""
        with self._lock:
            self._make_room(0)

    def _make_room(self, size: int) -> None:
        """Unmap waiting slots, of the classes used longest ago first, until ``size``
        more bytes fit within ``limit`` or none wait. Called with the lock held."""
        while self.resident + size > self.limit and self._free:
            cls, waiting = next(iter(self._free.items()))
            if not waiting:
                del self._free[cls]
                continue
            self._unmap(cls, waiting.pop())

    def _unmap(self, size: int, slot: mmap.mmap) -> None:
        slot.madvise(mmap.MADV_DONTNEED)
        self.resident -= size
        self.unmapped += 1

    def _give_back(self, size: int, slot: mmap.mmap) -> None:
        """The last view of ``slot`` is gone: keep it for the next buffer of its
        class, or unmap it while the pool is over its limit."""
        with self._lock:
            self.in_use -= size
            if self.resident > self.limit:
                self._unmap(size, slot)
                return
            self._free.setdefault(size, []).append(slot)
            self._free.move_to_end(size)
