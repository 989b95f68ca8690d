"""The real mla_offload_server as a child process on a free loopback port.

The binary is $MLA_OFFLOAD_SERVER, or the one in the Bazel test's runfiles
(data dependency //server:mla_offload_server). It runs on the CPU backend
with a small cache; its gRPC port is read from the "serving on" line it
prints. stop() sends SIGTERM, then SIGKILL if it has not exited in 8 s.
"""

import os
import pathlib
import re
import signal
import subprocess
import threading

SERVING = re.compile(r"serving on 127\.0\.0\.1:(\d+) ")
FLAGS = [
    "--listen=127.0.0.1:0",
    "--metrics_port=-1",
    "--backend=cpu",
    "--cpu_threads=2",
    "--kv_cache_gb=0.05",
    "--max_position=8192",
    "--drain_seconds=3",
]


def server_binary():
    override = os.environ.get("MLA_OFFLOAD_SERVER")
    if override:
        return pathlib.Path(override)
    srcdir, workspace = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return pathlib.Path(srcdir, workspace, "server", "mla_offload_server")
    return pathlib.Path(__file__).resolve().parents[3] / "bazel-bin" / "server" / "mla_offload_server"


class ServerProcess:
    def __init__(self, extra_flags=()):
        binary = server_binary()
        if not binary.exists():
            raise RuntimeError(f"{binary} does not exist: build //server:mla_offload_server "
                               "or set MLA_OFFLOAD_SERVER")
        self._process = subprocess.Popen([str(binary), *FLAGS, *extra_flags],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
        self._lines = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_for_line("serving on", 60)
        match = SERVING.search(line or "")
        if match is None:
            self.stop()
            raise RuntimeError("the server did not start; its output:\n" + self.output())
        self.port = int(match.group(1))
        self.target = f"127.0.0.1:{self.port}"

    def _read(self):
        for line in self._process.stdout:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._lines.append(None)
            self._changed.notify_all()

    def wait_for_line(self, text, timeout):
        """The first output line containing `text`, waiting up to `timeout` s."""
        with self._changed:
            found = []

            def seen():
                found[:] = [line for line in self._lines if line is not None and text in line]
                return found or (self._lines and self._lines[-1] is None)

            self._changed.wait_for(seen, timeout)
            return found[0] if found else None

    def output(self):
        with self._changed:
            return "".join(line for line in self._lines if line is not None)

    def signal(self, number):
        self._process.send_signal(number)

    def wait(self, timeout):
        """The exit status once the process ends within `timeout` s, else None."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """Stops the server; returns its exit status."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(8)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._reader.join(5)
        return self._process.returncode
