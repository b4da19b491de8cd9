"""The daemon's lifecycle: checks, backgrounding, the mount, signals, unmount.

Owns the process: it refuses bad mountpoints (a stale one left by a killed
daemon with how to clear it) and sources before anything is mounted, forks
into the background (the parent exits 0 only once the mount is live,
otherwise non-zero with the child's one-line reason), runs pyfuse3's main
loop in a trio nursery, and unmounts cleanly on SIGINT/SIGTERM: new
requests fail with EIO, requests under way get ``SHUTDOWN_GRACE`` seconds
to finish, then the rest are cancelled (the kernel fails them) and the
mount goes. When ``fusermount3 -u`` unmounts from outside, the main
loop ends and the process exits 0. SIGHUP rereads an S3 source's
credentials and drops the cached metadata (the catalog's answers, the
source's key indexes and block validations, and the period that decoded
chunks, kept page caches and reference indexes belong to), so storage is
read again on the next access; SIGUSR1 writes
``-o stats_file``. With ``NOTIFY_SOCKET`` set (systemd ``Type=notify``) it
sends ``READY=1`` once the mount is live, ``STATUS=`` every
``STATUS_INTERVAL`` seconds, ``WATCHDOG=1`` every half ``WATCHDOG_USEC``
when systemd watches this process, and ``STOPPING=1`` on the way out.

Concurrency: one trio run per process. Background work (chunk prefetches,
writes to ``cache_dir``) lives in the nursery opened by ``_mount_and_serve``
and is cancelled before the unmount, once the writes queued for the disk
cache have ended (at most ``DISK_SETTLE`` seconds); the FUSE loop, the
signal watchers and the systemd notifications live in ``_loop``'s nursery,
so a wedged loop stops sending ``WATCHDOG=1`` and systemd restarts the
service. A SIGHUP takes effect between two awaits of the trio thread:
requests under way keep the objects they hold, and later ones fetch again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import logging.handlers
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyfuse3
import trio

from layouts import decoding
from layouts.views import VIEWS
from mountd import logsafe, stats
from mountd.acls import AclPolicy, read_map
from mountd.cache.chunkcache import ChunkCache
from mountd.cache.memlimit import HEADROOM, Elastic, Lender, MemoryLimit
from mountd.cache.metacache import CachedCatalog
from mountd.config import MountConfig
from mountd.errors import MountError, SourceError
from mountd.fuse_ops import Operations, Owner
from mountd.gcpolicy import tune_gc
from mountd.io.blockcache import BlockCache
from mountd.sources import Source, open_source
from mountd.tree import Tree, make_tree
from mountd.tree.h5view import H5Views
from mountd.tree.sizerecords import SizeRecords

log = logging.getLogger(__name__)


#: Seconds that requests under way at SIGTERM/SIGINT get to finish before the
#: unmount (new ones fail with EIO meanwhile); well under systemd's stop timeout.
SHUTDOWN_GRACE = 5.0
#: Seconds the unmount waits for blocks and chunks queued for ``cache_dir``.
DISK_SETTLE = 10.0
#: Seconds between two ``STATUS=`` updates sent to systemd.
STATUS_INTERVAL = 5.0


class StartError(Exception):
    """The mount cannot start; the message is the one line shown to the user."""


def check_mountpoint(path: str) -> None:
    try:
        os.statvfs(path)  # unlike stat, never answered from the kernel's attribute cache
    except OSError as exc:
        # ECONNABORTED where the kernel aborted requests the dead daemon held.
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise StartError(
                f"mountpoint {path} is a stale mount left by a daemon that died (transport "
                f"endpoint is not connected); clear it with `fusermount3 -u {path}` "
                f"(-o auto_unmount prevents this)") from None
    if not os.path.exists(path):
        raise StartError(f"mountpoint {path} does not exist")
    if not os.path.isdir(path):
        raise StartError(f"mountpoint {path} is not a directory")
    if os.path.ismount(path):
        raise StartError(f"mountpoint {path} is already mounted")


def check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise StartError("FUSE is not available: /dev/fuse does not exist "
                         "(is the fuse kernel module loaded?)")
    if os.geteuid() != 0:
        if shutil.which("fusermount3") is None:
            raise StartError("FUSE is not available: fusermount3 is not installed "
                             "(apt-get install fuse3)")
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise StartError("FUSE is not available: /dev/fuse cannot be opened")


#: glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: Freed heap memory glibc may keep for reuse: a few decoded chunks' worth, not
#: more, so the daemon's RSS stays near its cache budgets.
_KEEP_FREED = 64 << 20


def keep_freed_memory() -> None:
    """Ask glibc to keep freed buffers for reuse instead of returning them.

    Cached blocks, decoded chunks and row bands live in the caches' own
    recycled buffers (``mountd.cache.bufpool``), but S3 responses and the
    decoders' working buffers are megabytes each, allocated and freed all the
    time on the heap. By default glibc hands such blocks back to the kernel,
    and touching fresh pages again is expensive (on VMs with free page
    reporting, about 2 s per GiB). Measured here, keeping up to 1 GiB: 5%
    less CPU for a cold read of a 1 GiB ``.npy`` (the smaller bound below was
    not measured on its own). What is kept is bounded (``_KEEP_FREED`` at the
    top of the heap, and two arenas, so each decoding thread does not keep a
    heap of its own), because the caches' byte budgets are what users size the
    daemon's memory by. A 16 MiB bound instead lowered the peak of a 4 GiB
    S3 stream by at most 10 MiB (``docs/benchmarks.md``, "Memory while
    streaming from S3"). Does nothing where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED)
        libc.mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):
        log.debug("mallopt not available; using the C library's defaults")


def setup_logging(config: MountConfig, to_stderr: bool) -> None:
    handlers: list[logging.Handler] = []
    if config.log_file:
        handlers.append(logging.FileHandler(config.log_file))
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    elif not config.log_file and os.path.exists("/dev/log"):
        handlers.append(logging.handlers.SysLogHandler("/dev/log"))
    fmt = "%(asctime)s h5mount[%(process)d] %(levelname)s %(name)s: %(message)s"
    redact = logsafe.RedactFilter()
    for handler in handlers:
        handler.addFilter(redact)
    level = logging.getLevelName(config.log_level.upper())
    logging.basicConfig(level=level, format=fmt,
                        handlers=handlers or [logging.NullHandler()], force=True)
    logsafe.quiet_libraries(level)


def sd_notify(message: str) -> None:
    """Tell systemd about our state, if it is listening."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), address)


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of systemd's ``WATCHDOG_USEC``),
    or None if systemd does not watch this process."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID")
    if not os.environ.get("NOTIFY_SOCKET") or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2e6


async def _notify_systemd(status: Callable[[], str]) -> None:
    """Send ``STATUS=`` every ``STATUS_INTERVAL`` seconds, and ``WATCHDOG=1`` now and
    every half ``WATCHDOG_USEC`` if systemd watches us; until cancelled."""
    watchdog = watchdog_interval()
    next_ping = trio.current_time()
    next_status = next_ping + STATUS_INTERVAL
    while True:
        now = trio.current_time()
        if now >= next_status:
            sd_notify(f"STATUS={status()}")
            next_status = now + STATUS_INTERVAL
        if watchdog is not None and now >= next_ping:
            sd_notify("WATCHDOG=1")
            next_ping = now + watchdog
        await trio.sleep_until(next_status if watchdog is None else min(next_status, next_ping))


def _invalidate_attributes(inodes: list[int]) -> None:
    """Make the kernel ask again for the attributes (sizes, times) of ``inodes``.

    Attributes only: the kernel takes no page lock for that, so a read under
    way cannot block the call; pages are dropped at the file's next open
    (``Tree.keep_pages``). Runs in a worker thread, as pyfuse3 asks.
    """
    for ino in inodes:
        with contextlib.suppress(OSError):  # an inode the kernel has forgotten meanwhile
            pyfuse3.invalidate_inode(ino, attr_only=True)


def _own_bdi(mountpoint: str) -> str | None:
    """The sysfs bdi directory of *our* FUSE mount at ``mountpoint``, or None.

    Blocks on a FUSE request to ourselves, so it must run in a worker thread.
    The device number is checked against /proc/self/mountinfo, so no other
    device's settings are ever touched.
    """
    dev = os.stat(mountpoint).st_dev
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            rest = fields[fields.index("-") + 1:] if "-" in fields else []
            if fields[2] == wanted and fields[4] == mountpoint and rest[:1] == ["fuse.h5mount"]:
                return f"/sys/class/bdi/{wanted}"
    return None


def _raise_readahead(mountpoint: str, size: int) -> None:
    """Let the kernel send reads of up to ``size`` bytes (needs root; else a no-op)."""
    try:
        bdi = _own_bdi(mountpoint)
        if bdi is None:
            log.info("readahead left as is: the mount's bdi was not found")
            return
        with open(f"{bdi}/read_ahead_kb", "w") as f:
            f.write(str(size // 1024))
        log.info("readahead of %s set to %d KiB", mountpoint, size // 1024)
    except OSError as exc:
        log.info("readahead left as is: %s", exc)


async def _loop(ops: Operations, config: MountConfig, ready: Callable[[], None], *,
                report: Callable[[], None], refresh: Callable[[], Awaitable[None]],
                status: Callable[[], str]) -> bool:
    """Run the FUSE loop until unmounted or signalled; True if a signal ended it.
    SIGUSR1 calls ``report``, SIGHUP ``refresh``; ``status`` is the summary
    systemd shows."""
    signalled = False
    async with trio.open_nursery() as nursery:

        async def main_loop() -> None:
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

        async def watch_signals(task_status: trio.TaskStatus[None]) -> None:
            nonlocal signalled
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("received %s, unmounting", signal.Signals(signum).name)
                    signalled = True
                    await ops.drain(SHUTDOWN_GRACE)
                    nursery.cancel_scope.cancel()
                    return

        async def watch_requests(task_status: trio.TaskStatus[None]) -> None:
            with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGHUP) as signals:
                task_status.started()
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        await refresh()
                    else:
                        report()

        nursery.start_soon(main_loop)
        # Both receivers are in place before the mount is reported ready.
        await nursery.start(watch_signals)
        await nursery.start(watch_requests)
        if config.readahead:
            await trio.to_thread.run_sync(_raise_readahead, config.mountpoint, config.readahead,
                                          abandon_on_cancel=True)
        ready()
        if os.environ.get("NOTIFY_SOCKET"):
            nursery.start_soon(_notify_systemd, status)
    return signalled


async def _mount_and_serve(config: MountConfig, ready: Callable[[], None]) -> None:
    """Open the source, mount, serve until the end, unmount.

    Raises StartError if the source or the mount fails. Runs entirely in the
    process that serves the mount: trio's worker threads do not survive a
    fork, so nothing trio-related may run before the daemon forks.
    """
    try:
        async with open_source(config) as source:
            await _serve(config, source, ready)
    except SourceError as exc:
        raise StartError(str(exc)) from exc


def acl_policy(config: MountConfig) -> AclPolicy | None:
    """The HSDS ACL policy of ``-o hsds_acls``/``acl_map``, or None."""
    if not config.hsds_acls:
        return None
    return AclPolicy(read_map(Path(config.acl_map)) if config.acl_map else None)


def memory_limit(config: MountConfig, tree: Tree, blocks: BlockCache | None
                 ) -> MemoryLimit | None:
    """The mount's ``-o memory_limit`` over its caches, or None when it is 0.

    The lenders, in the order they give way: the block cache (refetching a block
    costs a request), the memo (made again from cached objects), the chunk cache
    last and least (a sequential reader needs a chunk row of it)."""
    caches: list[tuple[str, Elastic, int]] = []
    if blocks is not None:
        caches.append(("blocks", blocks, 8))
    caches += [("memo", tree.memo, 8), ("chunks", tree.chunk_cache, 2)]
    lenders = [Lender(name, cache, cache.budget, cache.budget // share)
               for name, cache, share in caches]
    limit = config.memory_limit
    if limit is None:
        limit = sum(lender.full for lender in lenders) + HEADROOM
    if not limit:
        return None
    held = tree.held
    return MemoryLimit(limit, lenders, besides=lambda: held.used, trim=_malloc_trim())


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)``: the heap's free pages given back; None elsewhere."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


async def _serve(config: MountConfig, source: Source, ready: Callable[[], None]) -> None:
    """Make the mount's parts, each once and before the parts that use it (the
    chunk cache, the catalog, the ``D.h5`` views, the tree, its root node, the
    operations and their control directory), then mount and serve."""
    keep_freed_memory()
    tune_gc()
    cache = ChunkCache(config.chunk_cache)
    if config.chunk_cache:  # chunks decoded in place are born in the buffers the cache keeps
        decoding.OUTPUT.take = cache.pool.buffer
    catalog = CachedCatalog(source.catalog, ttl=config.metadata_ttl)
    disk = source.block_cache.disk if source.block_cache is not None else None
    tree = make_tree(catalog, views=VIEWS, ttl=config.metadata_ttl, chunk_cache=cache,
                     h5views=H5Views.for_mount(config), memo_bytes=config.meta_cache,
                     size_records=SizeRecords(disk, config.source))
    limiter = memory_limit(config, tree, source.block_cache)
    if tree.h5views is not None:
        tree.h5views.memory = limiter
    started, started_monotonic = time.time(), time.monotonic()

    def reporter(ops: Operations) -> stats.Reporter:
        """The documents of this mount, read from ``ops``: made for the control
        directory as the operations are made, and for each write of the stats
        file; a reporter keeps no state but the start times, which they share."""
        return stats.Reporter(config, ops, tree, catalog, source.block_cache, limiter,
                              started=started, started_monotonic=started_monotonic)

    ops = Operations(await tree.root(), Owner(config.uid, config.gid), ttl=config.metadata_ttl,
                     acls=acl_policy(config),
                     control=lambda served: reporter(served).control_dir())
    try:
        pyfuse3.init(ops, config.mountpoint, config.fuse_options())
    except RuntimeError as exc:
        raise StartError(f"cannot mount on {config.mountpoint}: {exc}") from exc
    log.info("mounted %s on %s", config.source, config.mountpoint)
    unmount = True  # unless the kernel ended the session (fusermount3 -u)

    def report() -> None:
        if config.stats_file:
            stats.write(config.stats_file, reporter(ops).figures())

    async def refresh() -> None:
        await source.refresh()
        catalog.drop()
        tree.refresh()
        log.info("SIGHUP: cached metadata and key indexes dropped; storage is read again "
                 "on the next access")
        await trio.to_thread.run_sync(_invalidate_attributes, ops.inodes.numbers())

    def status() -> str:
        text = (f"serving {logsafe.redact(config.source)}: {len(ops.inodes)} inodes, "
                f"{len(catalog)} objects cached; chunk cache {cache.used >> 20} of "
                f"{cache.budget >> 20} MiB, {cache.hits} hits, {cache.misses} misses")
        if source.block_cache is not None:
            blocks = source.block_cache.stats
            text += f"; block cache {blocks.hits} hits, {blocks.misses} misses"
        return text

    try:
        async with trio.open_nursery() as background:
            cache.nursery = background
            if source.block_cache is not None:
                source.block_cache.nursery = background
            if limiter is not None:
                background.start_soon(limiter.run)
            unmount = await _loop(ops, config, ready, report=report, refresh=refresh,
                                  status=status)
            disk = None if source.block_cache is None else source.block_cache.disk
            if disk is not None and not await disk.settle(DISK_SETTLE):
                log.warning("unmounting before the disk cache's writes ended (waited %g s); "
                            "cache_dir keeps what was written", DISK_SETTLE)
            background.cancel_scope.cancel()
    finally:
        report()
        sd_notify("STOPPING=1")
        pyfuse3.close(unmount=unmount)
        log.info("unmounted %s (chunk cache: %d hits, %d misses)", config.mountpoint,
                 cache.hits, cache.misses)
        if source.block_cache is not None:
            log.info("block cache: %s", source.block_cache.stats)


def run(config: MountConfig) -> int:
    """Check, mount and serve; the process's exit code."""
    try:
        check_mountpoint(config.mountpoint)
        check_fuse()
    except StartError as exc:
        print(f"h5mount: {logsafe.redact(str(exc))}", file=sys.stderr)
        return 1
    if config.foreground:
        return _run_foreground(config)
    return _run_background(config)


def _run_foreground(config: MountConfig) -> int:
    setup_logging(config, to_stderr=True)
    try:
        trio.run(_mount_and_serve, config, lambda: sd_notify("READY=1"))
    except (StartError, MountError) as exc:
        print(f"h5mount: {logsafe.redact(str(exc))}", file=sys.stderr)
        return 1
    except Exception:
        log.exception("daemon failed")
        return 1
    return 0


def _run_background(config: MountConfig) -> int:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.readline().decode(errors="replace").strip()
        if message == "OK":
            return 0
        os.waitpid(pid, 0)
        print(f"h5mount: {message or 'the daemon exited before the mount was ready'}",
              file=sys.stderr)
        return 1
    os.close(read_fd)
    os._exit(_daemon_child(config, write_fd))


def _daemon_child(config: MountConfig, write_fd: int) -> int:
    os.setsid()
    os.chdir("/")
    setup_logging(config, to_stderr=False)
    pipe = os.fdopen(write_fd, "wb", buffering=0)

    def ready() -> None:
        pipe.write(b"OK\n")
        pipe.close()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        sd_notify("READY=1")

    try:
        trio.run(_mount_and_serve, config, ready)
    except (StartError, MountError) as exc:
        if not pipe.closed:
            pipe.write(f"{logsafe.redact(str(exc))}\n".encode())
        log.error("%s", exc)
        return 1
    except BaseException:
        log.exception("daemon failed")
        if not pipe.closed:
            pipe.write(b"the daemon failed; see its log\n")
        return 1
    return 0
