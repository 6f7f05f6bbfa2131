"""The agent's configuration, from the command line (``python -m agents --help``).

The node token is read from a file, never from the command line or the environment,
so it does not show up in process listings. So is the one-time enrollment token; the node
token it is exchanged for is kept in the state directory (agents.enroll).
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agents.enroll import read_stored_token
from agents.runtime import DEFAULT_LOG_MAX_BYTES
from agents.runtime.docker import (
    DEFAULT_PULL_TIMEOUT_S,
    PULL_POLICIES,
    PullPolicy,
    RegistryAuth,
    read_registry_auth,
)
from agents.runtime.policy import VolumeRoot
from agents.versions import MinimumVersions

AGENT_PATH = "/ws/agent/"


@dataclass(frozen=True)
class AgentConfig:
    portal_url: str  # the websocket URL, already ending in /ws/agent/
    token: str  # empty until enrollment (enroll_token) gives one
    runtime: str = "process"
    simulate: str | None = None
    state_dir: Path = Path("/var/lib/gpuportal-agent")
    node_name: str = field(default_factory=socket.gethostname)
    telemetry_interval_s: float = 5.0
    heartbeat_interval_s: float = 10.0
    monitor_interval_s: float = 0.5
    resync_interval_s: float = 30.0  # how often the last desired set is applied again
    volume_roots: tuple[VolumeRoot, ...] = ()
    checkpoint_roots: tuple[Path, ...] = ()
    allowed_registries: tuple[str, ...] = ()
    pull_policy: PullPolicy = "missing"
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S
    # Read from --registry-auth at start; kept out of the repr, so a logged config holds no secret.
    registry_auth: dict[str, RegistryAuth] = field(default_factory=dict, repr=False)
    docker_host: str | None = None
    network_mode: str = "none"
    request_gpus: bool = True
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # per stream per attempt on the host; 0: no cap
    minimum_versions: MinimumVersions = field(default_factory=MinimumVersions)
    seed: int = 0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 60.0
    log_level: str = "INFO"
    log_format: str = "text"
    enroll_token: str = ""


def agent_url(portal: str) -> str:
    """``http(s)://host[:port]`` or ``ws(s)://...`` -> the agent websocket URL on that portal."""
    parts = urlsplit(portal)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"portal URL {portal!r} must be http(s):// or ws(s):// with a host")
    path = parts.path.rstrip("/")
    if not path.endswith(AGENT_PATH.rstrip("/")):
        path += AGENT_PATH.rstrip("/")
    return urlunsplit((scheme, parts.netloc, path + "/", "", ""))


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    parser = argparse.ArgumentParser(prog="python -m agents", description="GPU Portal node agent")
    parser.add_argument("--portal", required=True, help="portal base URL, e.g. https://portal.example.org")
    credentials = parser.add_mutually_exclusive_group(required=True)
    credentials.add_argument("--token-file", type=Path, help="file holding this node's token")
    credentials.add_argument(
        "--enroll-token-file",
        type=Path,
        help="file holding a one-time enrollment token, exchanged on the first start for the node's "
        "token, which is kept in STATE_DIR/node.token (mode 600) and used from then on",
    )
    parser.add_argument("--runtime", choices=("docker", "process"), default="docker")
    parser.add_argument(
        "--simulate", metavar="dgx-a100|dgx1-v100|FILE", help="simulated GPUs instead of NVML"
    )
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/gpuportal-agent"))
    parser.add_argument("--node-name", default=socket.gethostname())
    parser.add_argument("--telemetry-interval", type=float, default=5.0, help="seconds, at least 1")
    parser.add_argument("--heartbeat-interval", type=float, default=10.0, help="seconds, at least 1")
    parser.add_argument(
        "--volume-root",
        action="append",
        default=[],
        metavar="PATH[:rw]",
        help="host directory jobs may mount (read-only unless :rw); repeatable",
    )
    parser.add_argument(
        "--checkpoint-root",
        action="append",
        default=[],
        type=Path,
        help="directory checkpoint dirs must lie in; repeatable (default: STATE_DIR/checkpoints)",
    )
    parser.add_argument(
        "--allowed-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="image registry containers may come from (docker.io for Docker Hub); repeatable; default any",
    )
    parser.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default="missing",
        help="when to pull a job's image before its container is created: missing (only when the "
        "engine does not have it), always, or never",
    )
    parser.add_argument(
        "--pull-timeout",
        type=float,
        default=DEFAULT_PULL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"an image pull that takes longer fails its attempts (default {DEFAULT_PULL_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--registry-auth",
        type=Path,
        metavar="FILE",
        help='registry credentials, a Docker config.json-style file: {"auths": {"HOST": {"auth": '
        'base64("user:password")}}} or username and password fields; read once at start',
    )
    parser.add_argument("--docker-host", help="Docker endpoint (default: DOCKER_HOST or the local socket)")
    parser.add_argument("--network-mode", default="none", help="network of job containers (never host)")
    parser.add_argument(
        "--no-gpu-request",
        action="store_true",
        help="do not ask Docker for NVIDIA devices (no NVIDIA runtime)",
    )
    parser.add_argument(
        "--log-max-bytes",
        type=int,
        default=DEFAULT_LOG_MAX_BYTES,
        metavar="BYTES",
        help="output of each stream of an attempt kept on this host; beyond it the process runtime "
        "drops the rest and Docker's log rotation the oldest (default 100 MiB, the portal's "
        "LOG_MAX_BYTES_PER_ATTEMPT; 0: no cap)",
    )
    parser.add_argument("--min-docker-version", default=MinimumVersions.docker)
    parser.add_argument("--min-runc-version", default=MinimumVersions.runc)
    parser.add_argument("--min-nvidia-toolkit-version", default=MinimumVersions.nvidia_container_toolkit)
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated telemetry")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object a line"
    )
    args = parser.parse_args(argv)
    if args.telemetry_interval < 1 or args.heartbeat_interval < 1:
        parser.error("intervals must be at least 1 second")
    if args.network_mode == "host" or args.network_mode.startswith("container:"):
        parser.error("job containers never share the host's or another container's network")
    if not args.pull_timeout > 0:
        parser.error("--pull-timeout must be a positive number of seconds")
    if args.log_max_bytes < 0:
        parser.error("--log-max-bytes must be 0 (no cap) or a number of bytes")
    registry_auth = {}
    if args.registry_auth is not None:
        try:
            registry_auth = read_registry_auth(args.registry_auth)
        except ValueError as error:
            parser.error(str(error))
    state_dir = args.state_dir.resolve()
    token, enroll_token = "", ""
    if args.token_file is not None:
        token = args.token_file.read_text().strip()
        if not token:
            parser.error(f"token file {args.token_file} is empty")
    elif not (token := read_stored_token(state_dir)):
        enroll_token = args.enroll_token_file.read_text().strip()
        if not enroll_token:
            parser.error(f"enrollment token file {args.enroll_token_file} is empty")
    return AgentConfig(
        portal_url=agent_url(args.portal),
        token=token,
        runtime=args.runtime,
        simulate=args.simulate,
        state_dir=state_dir,
        node_name=args.node_name,
        telemetry_interval_s=args.telemetry_interval,
        heartbeat_interval_s=args.heartbeat_interval,
        volume_roots=tuple(VolumeRoot.parse(text) for text in args.volume_root),
        checkpoint_roots=tuple(args.checkpoint_root) or (state_dir / "checkpoints",),
        allowed_registries=tuple(args.allowed_registry),
        pull_policy=args.pull,
        pull_timeout_s=args.pull_timeout,
        registry_auth=registry_auth,
        docker_host=args.docker_host,
        network_mode=args.network_mode,
        request_gpus=not args.no_gpu_request,
        log_max_bytes=args.log_max_bytes,
        minimum_versions=MinimumVersions(
            docker=args.min_docker_version or None,
            runc=args.min_runc_version or None,
            nvidia_container_toolkit=args.min_nvidia_toolkit_version or None,
        ),
        seed=args.seed,
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        enroll_token=enroll_token,
    )
