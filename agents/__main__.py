"""``python -m agents --portal URL --token-file FILE [...]``: run the node agent.

Stopping the agent (SIGTERM, SIGINT) never stops the attempts: they keep running and
the next agent on the same state directory reattaches to them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import signal

from docker.errors import DockerException

from agents.agent import Agent, Backoff
from agents.config import AgentConfig, is_loopback_url, parse_args
from agents.devices import DeviceBackend
from agents.devices.nvml import DeviceError
from agents.enroll import EnrollmentRefused, enroll
from agents.logs import JsonFormatter
from agents.runtime import Runtime
from agents.runtime.policy import HostPolicy
from agents.versions import detect_toolkit_version

log = logging.getLogger("agents")


def build_backend(config: AgentConfig) -> DeviceBackend:
    if config.simulate:
        from agents.devices.simulated import SimulatedBackend, load_description

        return SimulatedBackend(load_description(config.simulate), config.node_name, seed=config.seed)
    from agents.devices.nvml import NvmlBackend

    memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return NvmlBackend(config.node_name, cpu_count=os.cpu_count() or 1, memory_total_mib=memory_mib)


def build_runtime(config: AgentConfig) -> Runtime:
    policy = HostPolicy(
        volume_roots=config.volume_roots,
        checkpoint_roots=config.checkpoint_roots,
        forbidden_sources=(config.state_dir,),
        allowed_registries=config.allowed_registries,
    )
    if config.runtime == "process":
        from agents.runtime.process import ProcessRuntime

        return ProcessRuntime(config.state_dir, policy, log_max_bytes=config.log_max_bytes)
    import docker

    from agents.runtime.docker import DockerRuntime

    client = docker.DockerClient(base_url=config.docker_host) if config.docker_host else docker.from_env()
    # Simulated GPUs have made-up uuids that no NVIDIA runtime could hand out.
    request_gpus = config.request_gpus and not config.simulate
    return DockerRuntime(
        client,
        policy,
        network_mode=config.network_mode,
        request_gpus=request_gpus,
        pull_policy=config.pull_policy,
        pull_timeout_s=config.pull_timeout_s,
        registry_auth=config.registry_auth,
        log_max_bytes=config.log_max_bytes,
    )


async def main_async(config: AgentConfig) -> None:
    backend = build_backend(config)
    try:
        runtime = build_runtime(config)
    except Exception:
        backend.close()
        raise
    real_gpus_in_containers = config.runtime == "docker" and config.request_gpus and not config.simulate
    agent = Agent(
        config,
        backend,
        runtime,
        toolkit_version=detect_toolkit_version() if config.runtime == "docker" else None,
        check_toolkit=real_gpus_in_containers,
    )
    from agents.runtime.docker import DockerRuntime

    if isinstance(runtime, DockerRuntime):
        runtime.progress = agent.report_starting  # how far an image pull got, in the attempt's status
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel if task else lambda: None)
    try:
        await agent.run()
    except asyncio.CancelledError:
        log.info("agent stopped; attempts keep running")
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    handler = logging.StreamHandler()
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=config.log_level, handlers=[handler])
    if not is_loopback_url(config.portal_url) and config.portal_url.startswith("ws://"):
        log.warning("the node token travels unencrypted to %s; use https:// in production", config.portal_url)
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not config.token:
        backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, random.Random(config.seed))
        try:
            token = enroll(
                config.portal_url, config.enroll_token, config.node_name, config.state_dir, backoff.next_delay
            )
        except EnrollmentRefused as refused:
            log.error("the portal refused the enrollment token (%s); ask an admin for a new one", refused)
            return 2
        config = dataclasses.replace(config, token=token, enroll_token="")
    try:
        asyncio.run(main_async(config))
    except (DeviceError, DockerException) as error:
        hint = " (use --simulate for simulated GPUs)" if isinstance(error, DeviceError) else ""
        log.error("cannot start the agent: %s%s", error, hint)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
