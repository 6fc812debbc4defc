"""`letterbox serve` as a child process, for the Python tests
(tests/python/test_core_flow.py, tests/console/test_console.py): started on
127.0.0.1:0, with the addresses it announces on its standard output read
back (src/launch.rs defines those lines), and checks that `python -O`
does not remove.

The server never outlives the script that started it: on Linux the kernel
kills it if the script dies, and `close()` kills it otherwise."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time

STARTUP_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 30

GRPC_PREFIX = "letterbox listening on "
CONSOLE_PREFIX = "letterbox console at "


class CheckFailed(Exception):
    pass


def check(cond, what):
    """An assertion that `python -O` does not remove."""
    if not cond:
        raise CheckFailed(what)


def check_eq(actual, expected, what):
    if actual != expected:
        raise CheckFailed(f"{what}: expected {expected!r}, got {actual!r}")


def _parent_death_signal():
    """On Linux, a function to run in the child between fork and exec that
    makes the kernel SIGKILL the server if this script dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1

    def set_it():
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))

    return set_it


class Server:
    """`BIN serve --data-dir DATA_DIR --listen 127.0.0.1:0 ARGS...` with its
    standard error in `log_path`; `addr` is the gRPC address and, when
    `console` is true (ARGS turn the console on), `url` the console's base
    URL, both read from its standard output."""

    def __init__(self, bin_path, data_dir, log_path, args=(), console=False):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [bin_path, "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=dict(os.environ, NO_COLOR="1"),  # plain logs
            preexec_fn=_parent_death_signal(),
        )
        lines = queue.Queue()

        def pump():  # every line to `lines`, so stdout never fills
            for raw in self.proc.stdout:
                lines.put(raw.decode(errors="replace").rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.addr = self.url = None
        wanted = f"'{GRPC_PREFIX}ADDR'" + (f" and '{CONSOLE_PREFIX}URL'" if console else "")
        seen = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.addr is None or (console and self.url is None):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.kill()
                raise CheckFailed(
                    f"server did not print {wanted} within {STARTUP_TIMEOUT_S}s "
                    f"(exit code {self.proc.returncode}); its standard output: {seen!r}\n"
                    f"--- log ---\n{self.log_tail()}"
                )
            seen.append(line)
            if line.startswith(GRPC_PREFIX):
                self.addr = line[len(GRPC_PREFIX):].strip()
            elif line.startswith(CONSOLE_PREFIX):
                self.url = line[len(CONSOLE_PREFIX):].strip()

    def terminate(self):
        """SIGTERM, then the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.kill()
        self._log.close()

    def log_tail(self, lines=40):
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
