"""A private Docker engine for the tests that run real containers.

``dockerd`` is started with no bridge and no iptables, in a temporary data root, and stopped at
teardown; it creates no network and pulls nothing. The image is built locally from Debian's
busybox-static binary. Where the engine cannot start (no dockerd, not root, no busybox), the
tests that use it are skipped with the reason. A module that uses :func:`engine` gets one engine
for all its tests.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

IMAGE = "gpuportal-test/busybox:1"
PR_SET_PDEATHSIG = 1
BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = (
    "sh",
    "echo",
    "sleep",
    "cat",
    "env",
    "ls",
    "id",
    "touch",
    "test",
    "mv",
    "ps",
    "find",
    "nc",
    "wget",
    "readlink",
    "grep",
)


def why_no_engine() -> str | None:
    if shutil.which("dockerd") is None:
        return "dockerd is not installed (Debian package docker.io)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    if not BUSYBOX.exists():
        return "no static busybox to build the test image from (Debian package busybox-static)"
    return None


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    reason = why_no_engine()
    if reason:
        pytest.skip(reason)
    # A short path: unix socket paths are limited to about 100 bytes.
    root = Path(tempfile.mkdtemp(prefix="gp-dockerd-", dir="/tmp"))
    socket = root / "docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - closed at teardown
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--host=unix://{socket}",
            f"--pidfile={root / 'docker.pid'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_terminate_with_parent,
    )
    client = None
    try:
        client = _connect(f"unix://{socket}", daemon)
        if client is None:
            tail = (root / "dockerd.log").read_text()[-600:]
            pytest.skip(f"dockerd did not start; log tail: {tail}")
        client.api.import_image_from_data(_busybox_rootfs(), repository=IMAGE.split(":")[0], tag="1")
        yield client
    finally:
        if client is not None:
            for container in client.containers.list(all=True):
                container.remove(force=True)
            client.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        # The engine leaves its default network namespace mounted under exec-root; while it is,
        # the directory cannot be removed.
        netns = root / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", str(netns)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _terminate_with_parent() -> None:
    """If pytest itself is killed, teardown never runs: let the kernel stop the engine then."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _connect(base_url: str, daemon: subprocess.Popen[bytes]) -> docker.DockerClient | None:
    """Wait for the engine to answer (it usually takes well under a second)."""
    for _ in range(300):
        if daemon.poll() is not None:
            return None
        try:
            client = docker.DockerClient(base_url=base_url, timeout=60)
            client.ping()
            return client
        except docker.errors.DockerException:
            time.sleep(0.1)
    return None


def _busybox_rootfs() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(BUSYBOX, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            archive.addfile(link)
        for directory in ("tmp", "data", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            archive.addfile(info)
    return buffer.getvalue()
