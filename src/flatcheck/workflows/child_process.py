"""Run one piece of work in a forked child process, so that its death is not the caller's.

A scan runs each model this way: when the kernel's OOM killer (or anything else) kills the
child, the parent is still alive to write that model's record — with the signal and the
child's peak resident memory, which os.wait4 returns as ru_maxrss even for a killed child —
and to go on with the next model. Memory a model leaks or fragments is returned to the system
when its child exits.

fork rather than a fresh interpreter: the child starts with torch, timm and flatcheck already
imported (a fresh `python -m` pays ~5 s of imports per model). fork cannot carry threads: a
forked child that enters a parallel region of an OpenMP pool its parent had used waits forever
for pool threads that do not exist in it. Whether a process has used the pool cannot be asked,
so a child runs torch on one thread (slow, but it cannot hang; as torch's DataLoader workers do)
unless its parent is known never to have used it: a `flatcheck` command's own process
(`mark_fresh_process`, called by the entry point before anything runs), while it keeps torch on
one thread itself (`parent_without_pool`). Such a child gets the thread count the command had.

The child talks to the parent over a pipe, one JSON line per message: {"progress": [...]} while
it works, then {"result": ...} once. A child that dies mid-line leaves a partial line, which the
parent ignores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable

# ru_maxrss is in KiB on Linux and in bytes on macOS
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


@dataclass
class ChildOutcome:
    result: Any  # what `work` returned, or None when the child did not get to send it
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    peak_rss_bytes: int
    threads: int = 1  # torch's thread count in the child

    @property
    def died(self) -> str | None:
        """Why the child ended without a result, in words; None when it sent one."""
        if self.result is not None:
            return None
        if self.signal is not None:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else str(self.signal)
            why = " (most often the kernel's OOM killer, when memory ran out)" if self.signal == signal.SIGKILL else ""
            return f"the model's process was killed by {name}{why}"
        return f"the model's process exited with code {self.exit_code} before sending its result"


def available() -> bool:
    return hasattr(os, "fork") and hasattr(os, "wait4")


_fresh = False  # this process is a flatcheck command's, and has computed nothing yet
_outer_threads: int | None = None


def mark_fresh_process() -> None:
    """Called by the command's entry point, before anything has run: this process has not
    used OpenMP's pool, so children forked while `parent_without_pool` holds may use it."""
    global _fresh
    _fresh = True


@contextlib.contextmanager
def parent_without_pool():
    """Run torch on one thread in this (the parent) process while the block runs, so that it
    does not use OpenMP's pool; yields the thread count its forked children may use: the one it
    had, in a fresh command process, else 1 (a parent that may have used the pool already)."""
    global _outer_threads
    if _outer_threads is not None:  # nested: the outer block has set it
        yield _outer_threads if _fresh else 1
        return
    import torch

    _outer_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _outer_threads if _fresh else 1
    finally:
        torch.set_num_threads(_outer_threads)
        _outer_threads = None


def fork_works() -> bool:
    """Whether a child forked now can run autograd. torch refuses it ("Unable to handle
    autograd's threading in combination with fork-based multiprocessing") in a child of a
    process whose autograd engine has started worker threads, which some earlier work in a
    long-lived process (a notebook, a test session) does; a command's fresh process has not.
    Asked of a child, at the cost of one fork."""

    def work(send) -> bool:
        import torch

        x = torch.ones(2, requires_grad=True)
        (x * x).sum().backward()
        return True

    return run_in_child(work).result is True


def run_in_child(work: Callable[[Callable[[Any], None]], Any], *, on_message: Callable[[Any], None] | None = None,
                 close_in_child: tuple[int, ...] = (), threads: int | None = None) -> ChildOutcome:
    """Call `work(send)` in a forked child and return its result with how the child ended.

    `send(obj)` (in the child) passes a JSON-able message to `on_message` (in the parent) while
    the work runs. `close_in_child`: descriptors the child must not keep open (a held output's
    flock would otherwise outlive a killed parent). On KeyboardInterrupt in the parent the
    child is killed and reaped before the interrupt goes on. `threads`: torch's thread count
    in the child, from `parent_without_pool` (default 1: see the module's docstring)."""
    threads = threads or 1
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(work, read_fd, write_fd, close_in_child, threads)
    os.close(write_fd)
    result = None
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                if not line.endswith(b"\n"):
                    break  # cut off by the child's death
                msg = json.loads(line)
                if "result" in msg:
                    result = msg["result"]
                elif on_message is not None:
                    on_message(msg["message"])
        _, status, usage = os.wait4(pid, 0)
    except BaseException:
        _kill_and_reap(pid)
        raise
    return ChildOutcome(
        result=result,
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        peak_rss_bytes=usage.ru_maxrss * _MAXRSS_UNIT,
        threads=threads,
    )


def _child(work, read_fd: int, write_fd: int, close_in_child: tuple[int, ...], threads: int) -> None:
    code = 1
    try:
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        os.close(read_fd)
        for fd in close_in_child:
            os.close(fd)
        # the parent's Ctrl-C handling (kill this child, write the interrupt line) is the
        # parent's; this child just ends when the parent kills it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # fresh stream objects: a lock of the parent's, held by another thread at the fork,
        # would never be released here
        sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
        sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
        out = os.fdopen(write_fd, "wb", buffering=0)

        def send(obj: Any) -> None:
            out.write((json.dumps({"message": obj}, allow_nan=False) + "\n").encode())

        result = work(send)
        out.write((json.dumps({"result": result}, allow_nan=False) + "\n").encode())
        out.close()
        code = 0
    except BaseException:  # noqa: BLE001 — reported to the parent by the exit code
        try:
            import traceback

            traceback.print_exc()
        finally:
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # no atexit handlers, no parent's cleanup run twice


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
