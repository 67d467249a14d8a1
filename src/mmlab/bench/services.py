"""A private PostgreSQL and Redis on this machine, from Debian's packages
(postgresql, redis-server): for the fleet's tests, `make bench-fleet`, and a
fleet tried out on one machine.  Each lives in a fresh directory, listens on
127.0.0.1 on a free port, and is stopped and removed when the block ends.

PostgreSQL refuses to run as root, so as root its directory belongs to the
`postgres` user the Debian package creates and its tools run as that user.
Redis keeps an append-only file, as a fleet's broker should.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.machine import proc

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin() -> Path:
    """The newest PostgreSQL server binaries Debian installed."""
    found = sorted(Path("/").glob(PG_BIN_GLOB.lstrip("/")),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not found or not (found[-1] / "initdb").exists():
        raise MmlabError("PostgreSQL is not installed (make setup installs postgresql)")
    return found[-1]


class PostgresCluster:
    """A throw-away cluster; `url(db)` for a database in it (made on first use)."""

    def __init__(self, max_connections: int = 200):
        self.max_connections = max_connections
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mmlab-pg-"))
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _tool(self, name: str, *args: str) -> None:
        proc.call([*self.as_user, str(pg_bin() / name), *args], what=name, timeout=120)

    def __enter__(self) -> PostgresCluster:
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        self._tool("initdb", "-D", str(data), "-U", "mmlab", "--auth=trust", "-E", "UTF8",
                   "--no-sync")
        self._tool("pg_ctl", "-D", str(data), "-l", str(self.dir / "log"), "-w", "-o",
                   f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   f"-c max_connections={self.max_connections}", "start")
        return self

    def url(self, database: str = "postgres") -> str:
        if database != "postgres":
            import psycopg
            with psycopg.connect(self.url(), autocommit=True) as conn:
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname=%s",
                                    (database,)).fetchone():
                    conn.execute(f'CREATE DATABASE "{database}"')
        return f"postgresql://mmlab@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int:
        """The postmaster's process id."""
        return int((self.dir / "data" / "postmaster.pid").read_text().split()[0])

    def __exit__(self, *exc) -> None:
        try:
            self._tool("pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Redis:
    """A private redis-server with an append-only file."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mmlab-redis-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def pid(self) -> int:
        """redis-server's process id, once started."""
        if self.proc is None:
            raise MmlabError("redis-server is not running")
        return self.proc.pid

    def __enter__(self) -> Redis:
        exe = shutil.which("redis-server")
        if not exe:
            raise MmlabError("redis-server is not installed (make setup installs it)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--save", "", "--logfile", str(self.dir / "log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise MmlabError(f"redis-server did not answer on port {self.port} (log: {self.dir}/log)")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)
