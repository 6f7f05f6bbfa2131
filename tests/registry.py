"""A minimal, read-only Docker Registry (HTTP API v2) for tests, on 127.0.0.1.

It serves images that a test built and exported with ``docker save``: both the OCI layout that
recent engines write (``index.json``, ``blobs/sha256/...``) and the older layout
(``manifest.json``, one ``layer.tar`` per layer), which it turns into a Docker schema 2 manifest
with gzipped layers. Engines treat registries on 127.0.0.0/8 as insecure, so plain HTTP works
and no traffic leaves loopback.

What tests need besides serving: basic auth (``credentials``), a throttle for blobs
(``bytes_per_second``, to make a pull slow enough to be cancelled), a brief outage (``outage``:
the next requests are answered with an error status, or their connection is reset), and records
of what was asked (``requests``) and of blob transfers the client broke off (``aborted_blobs``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import socket
import struct
import tarfile
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPES = (
    DOCKER_MANIFEST,
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    OCI_INDEX,
)
CHUNK = 16 * 1024
_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<reference>[^/]+)$")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Repository:
    tags: dict[str, str] = field(default_factory=dict)  # tag -> manifest digest
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # digest -> (media type, bytes)
    blobs: dict[str, bytes] = field(default_factory=dict)  # digest -> bytes


class Registry:
    """Use as a context manager; ``host`` is what image references start with."""

    def __init__(self, credentials: tuple[str, str] | None = None) -> None:
        self.credentials = credentials
        self.bytes_per_second: float | None = None  # None: blobs as fast as the client reads
        # How the next requests fail, one entry each: an HTTP status, or None to reset the
        # connection without an answer. Empty: every request is served.
        self.outage: list[HTTPStatus | None] = []
        self.repositories: dict[str, Repository] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.aborted_blobs = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True  # a throttled blob must not hold up the shutdown
        self.thread = threading.Thread(target=self.server.serve_forever, name="registry", daemon=True)

    def __enter__(self) -> Registry:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def host(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def manifest_requests(self, name: str, reference: str | None = None) -> int:
        """GET and HEAD requests for manifests of `name` (by tag or digest `reference`, or any)."""
        prefix = f"/v2/{name}/manifests/"
        with self.lock:
            paths = [path for _, path in self.requests if path.startswith(prefix)]
        return sum(1 for path in paths if reference is None or path == prefix + reference)

    def pings(self) -> int:
        """Requests for ``/v2/``: the engine begins each pull with one, so this counts pulls."""
        with self.lock:
            return sum(1 for _, path in self.requests if path == "/v2/")

    def blob_requests(self, name: str) -> int:
        with self.lock:
            return sum(
                1
                for method, path in self.requests
                if method == "GET" and path.startswith(f"/v2/{name}/blobs/")
            )

    def add(self, name: str, tag: str, archive: bytes) -> str:
        """Serve the image of a ``docker save`` archive as ``name:tag``; returns its manifest digest."""
        files = _archive_files(archive)
        repository = self.repositories.setdefault(name, Repository())
        if "index.json" in files:
            digest = _add_oci_layout(repository, files)
        else:
            digest = _add_docker_archive(repository, files)
        repository.tags[tag] = digest
        return digest


def _archive_files(archive: bytes) -> dict[str, bytes]:
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() or member.issym():  # the older layout links repeated layers
                content = tar.extractfile(member)
                if content is not None:
                    files[member.name.removeprefix("./")] = content.read()
    return files


def _add_oci_layout(repository: Repository, files: dict[str, bytes]) -> str:
    """The archive already holds manifests and blobs by digest: serve them as they are."""
    for path, data in files.items():
        if path.startswith("blobs/sha256/"):
            repository.blobs["sha256:" + path.rsplit("/", 1)[1]] = data
    index = json.loads(files["index.json"])
    top = index["manifests"][0]
    pending = [top]
    while pending:
        descriptor = pending.pop()
        data = repository.blobs[descriptor["digest"]]
        repository.manifests[descriptor["digest"]] = (descriptor["mediaType"], data)
        if descriptor["mediaType"] in (OCI_INDEX, MANIFEST_TYPES[1]):
            children = json.loads(data)["manifests"]
            pending += [child for child in children if child["digest"] in repository.blobs]
    return top["digest"]


def _add_docker_archive(repository: Repository, files: dict[str, bytes]) -> str:
    """The older layout has a config and uncompressed layers: describe them in a schema 2
    manifest, layers gzipped as a registry would hold them."""
    (image,) = json.loads(files["manifest.json"])
    config = files[image["Config"]]
    repository.blobs[digest_of(config)] = config
    layers = []
    for path in image["Layers"]:
        compressed = gzip.compress(files[path], mtime=0)
        repository.blobs[digest_of(compressed)] = compressed
        layers.append(
            {"mediaType": DOCKER_LAYER_GZIP, "size": len(compressed), "digest": digest_of(compressed)}
        )
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "size": len(config), "digest": digest_of(config)},
            "layers": layers,
        }
    ).encode()
    repository.manifests[digest_of(manifest)] = (DOCKER_MANIFEST, manifest)
    return digest_of(manifest)


def _handler_for(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the tests look at registry.requests instead

        def _serve(self, body: bool) -> None:
            with registry.lock:
                registry.requests.append((self.command, self.path))
                failing = bool(registry.outage)
                failure = registry.outage.pop(0) if failing else None
            if failing and failure is None:
                self._reset()
                return
            if failure is not None:
                code = "TOOMANYREQUESTS" if failure == HTTPStatus.TOO_MANY_REQUESTS else "UNAVAILABLE"
                self._error(failure, code, "the registry is down for a moment", body)
                return
            if not self._authorized():
                self._error(HTTPStatus.UNAUTHORIZED, "UNAUTHORIZED", "authentication required", body)
                return
            if self.path == "/v2/":
                self._reply(HTTPStatus.OK, "application/json", b"{}", body)
                return
            match = _PATH.match(self.path)
            repository = registry.repositories.get(match["name"]) if match else None
            if match is None or repository is None:
                self._error(HTTPStatus.NOT_FOUND, "NAME_UNKNOWN", "repository name not known", body)
            elif match["kind"] == "manifests":
                digest = repository.tags.get(match["reference"], match["reference"])
                if digest not in repository.manifests:
                    self._error(HTTPStatus.NOT_FOUND, "MANIFEST_UNKNOWN", "manifest unknown", body)
                    return
                media_type, data = repository.manifests[digest]
                self._reply(HTTPStatus.OK, media_type, data, body, digest)
            elif match["reference"] in repository.blobs:
                data = repository.blobs[match["reference"]]
                self._reply(HTTPStatus.OK, "application/octet-stream", data, body, match["reference"])
            else:
                self._error(HTTPStatus.NOT_FOUND, "BLOB_UNKNOWN", "blob unknown to registry", body)

        def _reset(self) -> None:
            """Close with a TCP reset, as a registry that went away mid-connection does."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        def _authorized(self) -> bool:
            if registry.credentials is None:
                return True
            expected = base64.b64encode(":".join(registry.credentials).encode()).decode()
            return self.headers.get("Authorization") == f"Basic {expected}"

        def _error(self, status: HTTPStatus, code: str, message: str, body: bool) -> None:
            data = json.dumps({"errors": [{"code": code, "message": message, "detail": None}]}).encode()
            self._reply(status, "application/json", data, body)

        def _reply(
            self, status: HTTPStatus, media_type: str, data: bytes, body: bool, digest: str | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", media_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if digest is not None:
                self.send_header("Docker-Content-Digest", digest)
            if status == HTTPStatus.UNAUTHORIZED:
                self.send_header("WWW-Authenticate", 'Basic realm="gpuportal-test"')
            self.end_headers()
            if body:
                self._write(data, throttled=digest is not None and "/blobs/" in self.path)

        def _write(self, data: bytes, throttled: bool) -> None:
            try:
                for start in range(0, len(data), CHUNK):
                    self.wfile.write(data[start : start + CHUNK])
                    rate = registry.bytes_per_second
                    if throttled and rate:
                        time.sleep(CHUNK / rate)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                with registry.lock:
                    registry.aborted_blobs += 1
                self.close_connection = True

    return Handler
