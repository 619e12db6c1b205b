"""Restarting exactly the database server the chaos run is connected to, and telling
whether it really restarted.

MariaDB/MySQL: the server names its own pid file (``@@pid_file``); the process in it is
shut down with ``SHUTDOWN`` and started again with the command line, working directory and
environment it had (``/proc/<pid>/``), unless a supervisor brought it back first. So a
private server on another port is restarted, never the one on 3306 beside it.
PostgreSQL: the Debian cluster whose data directory the server reports, through
``pg_ctlcluster``. Either way the server's start time (and pid) must change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection

LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


class Server:
    """The server behind ``connection``, as far as this machine can control it."""

    def __init__(self) -> None:
        self.vendor = connection.vendor
        self.pid = 0
        self.command: list[str] = []
        self.cwd = "/"
        self.environ: dict[str, str] = {}
        self.cluster: tuple[str, str] = ("", "")  # PostgreSQL: (version, name)
        self.data_directory = ""  # PostgreSQL outside pg_ctlcluster: run with pg_ctl
        self.unavailable = self._inspect()

    # ------------------------------------------------------------------ what it is

    def _inspect(self) -> str:
        """Why this server cannot be restarted from here, or ''."""
        if self.vendor == "sqlite":
            return "SQLite has no server"
        if str(connection.settings_dict.get("HOST") or "") not in LOCAL_HOSTS:
            return "the server is not on this machine"
        if self.vendor == "mysql":
            return self._inspect_mysql()
        if self.vendor == "postgresql":
            return self._inspect_postgresql()
        return f"no restart for {self.vendor}"

    def _inspect_mysql(self) -> str:
        pid_file = Path(_query("SELECT @@pid_file"))
        if not pid_file.is_absolute():
            pid_file = Path(_query("SELECT @@datadir")) / pid_file
        try:
            self.pid = int(pid_file.read_text().split()[0])
            proc = Path(f"/proc/{self.pid}")
            self.command = proc.joinpath("cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
            self.cwd = os.readlink(proc / "cwd")
            self.environ = dict(item.split("=", 1) for item in
                                proc.joinpath("environ").read_bytes().decode().split("\0")
                                if "=" in item)
        except (OSError, ValueError, IndexError) as exc:
            return f"cannot read the server's pid file {pid_file} or its process: {exc}"
        return ""

    def _inspect_postgresql(self) -> str:
        data = os.path.realpath(_query("SHOW data_directory"))
        if not shutil.which("pg_lsclusters") or not shutil.which("pg_ctlcluster"):
            return "" if self._plain_postgresql(data) else "no pg_lsclusters/pg_ctlcluster here"
        listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True,
                                text=True, timeout=30).stdout
        for line in listed.splitlines():
            fields = line.split()
            if len(fields) >= 6 and os.path.realpath(fields[5]) == data:
                self.cluster = (fields[0], fields[1])
                return ""
        if self._plain_postgresql(data):
            return ""
        return f"the server's data directory {data} is no pg_ctlcluster cluster"

    def _plain_postgresql(self, data: str) -> bool:
        """Whether the server is one started with pg_ctl (as clusters/pg.py does), which is
        then restarted the same way, as the data directory's owner."""
        if not Path(data, "postmaster.pid").exists():
            return False
        self.data_directory = data
        return True

    def describe(self) -> str:
        if self.vendor == "mysql":
            return f"the server of pid {self.pid}: {' '.join(self.command)}"
        if self.data_directory:
            return f"the PostgreSQL server of {self.data_directory}"
        return f"the PostgreSQL cluster {'/'.join(self.cluster)}"

    def state(self) -> dict[str, Any]:
        """When the server started (epoch seconds) and, where known, its pid."""
        if self.vendor == "mysql":
            started = float(_query(
                "SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
                "WHERE VARIABLE_NAME = 'UPTIME'"))
            pid_file = Path(_query("SELECT @@pid_file"))
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = 0
            return {"started": started, "pid": pid}
        started = float(_query("SELECT EXTRACT(EPOCH FROM pg_postmaster_start_time())"))
        return {"started": started, "pid": 0}

    # ------------------------------------------------------------------ restart

    def stop(self) -> None:
        if self.vendor == "mysql":
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SHUTDOWN")
            except DatabaseError:
                pass  # the server may drop the connection as it goes
            connection.close()
            deadline = time.monotonic() + 60
            while Path(f"/proc/{self.pid}").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server (pid {self.pid}) did not stop within 60 s")
                time.sleep(0.1)
        else:
            connection.close()
            if self.data_directory:
                self._pg_ctl("stop", "-m", "fast", "-w")
                return
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *self.cluster, "stop",
                            "-m", "fast"], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        if self.vendor == "mysql":
            if _answers():
                return  # a supervisor started it again already
            # Detached, its output dropped, as start-stop-daemon --background does: the
            # server outlives this run (its error log is where its own settings say).
            subprocess.Popen(self.command, cwd=self.cwd, env=self.environ,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        elif self.data_directory:
            self._pg_ctl("start", "-w", "-l", str(Path(self.data_directory) / "restarted.log"))
        else:
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *self.cluster, "start"],
                           check=True, capture_output=True, timeout=60)

    def _pg_ctl(self, *args: str) -> None:
        from clusters.common import as_user
        from clusters.pg import pg_bin

        owner = Path(self.data_directory).owner()
        subprocess.run(as_user(owner, [str(pg_bin() / "pg_ctl"), "-D", self.data_directory,
                                       *args]),
                       check=True, capture_output=True, timeout=60, cwd="/")

    def wait_until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer within {timeout:g} s of its start")
            time.sleep(0.2)


def _query(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def _answers() -> bool:
    try:
        connection.ensure_connection()
        _query("SELECT 1")
        return True
    except DatabaseError:
        connection.close()
        return False
