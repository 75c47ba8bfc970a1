"""A real nginx WebDAV server for the shared artifact store's tests: the configuration
docs/fleet.md gives a deployment, in a directory of its own on a free port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PREFIX = "abwatch"


def nginx_conf(root: Path, port: int, *, password: str | None = None) -> str:
    """The server block of docs/fleet.md, around a test's directories."""
    auth = (f'        auth_basic "abwatch artifacts";\n        auth_basic_user_file {root}/htpasswd;\n'
            if password else "")
    # as root, nginx's workers would run as nobody and could not write the test's directory
    user = "user root root;\n" if os.geteuid() == 0 else ""
    return f"""{user}worker_processes 1;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;
        location /{PREFIX}/ {{
            root {root}/data;
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
{auth}        }}
    }}
}}
"""


class WebDav:
    """nginx serving ``{root}/data/abwatch/`` as a WebDAV store: start, stop, and the files it holds."""

    def __init__(self, root: Path, *, password: str | None = None, user: str = "abwatch") -> None:
        self.root, self.password, self.user = root, password, user
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The store's URL for ``[artifacts] store``."""
        return f"http://127.0.0.1:{self.port}/{PREFIX}"

    def object_path(self, sha: str) -> Path:
        """Where nginx keeps object ``sha`` on disk."""
        return self.root / "data" / PREFIX / "cas" / sha

    def objects(self) -> list[Path]:
        """The objects the store holds."""
        found = self.root / "data" / PREFIX / "cas"
        return sorted(found.iterdir()) if found.is_dir() else []

    def requests(self, method: str) -> int:
        """How many ``method`` requests for objects the access log shows."""
        log = self.root / "access.log"
        return sum(f'"{method} /{PREFIX}/cas/' in line for line in log.read_text().splitlines()) if log.exists() else 0

    def start(self) -> WebDav:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        for sub in ("tmp", "data"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if self.password:  # nginx reads {PLAIN} passwords as they are (the test's own file)
            (self.root / "htpasswd").write_text(f"{self.user}:{{PLAIN}}{self.password}\n")
        conf = self.root / "nginx.conf"
        conf.write_text(nginx_conf(self.root, self.port, password=self.password))
        self.proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(self.root), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError("nginx did not listen within 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nginx's fast shutdown: the port is closed when it exits
            self.proc.wait(timeout=20)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
