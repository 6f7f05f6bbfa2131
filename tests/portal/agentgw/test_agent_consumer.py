"""The agent gateway over a real Channels stack (Redis channel layer, PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agents.protocol import (
    AttemptState,
    AttemptStatus,
    ExitReason,
    GpuInfo,
    GpuTopology,
    Heartbeat,
    Hello,
    HostInfo,
    LogChunk,
    RuntimeInfo,
    decode_from_portal,
    encode,
    utc_now,
)
from portal.accounts.services import create_api_token
from portal.cluster.models import Gpu, Node
from portal.cluster.services import issue_node_token
from portal.jobs.models import Job, LogLine
from tests.portal.test_time_slicing_store import two_running  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def application() -> Any:
    from portal.asgi import application

    return application


def hello(node: str, uuids: dict[int, str] | None = None, unhealthy: dict[int, str] | None = None) -> Hello:
    """A DGX-A100's hello: eight GPUs (or those of `uuids`, index -> UUID), the `unhealthy` ones
    with their reason."""
    uuids = {i: f"GPU-{node}-real-{i}" for i in range(8)} if uuids is None else uuids
    unhealthy = unhealthy or {}
    return Hello(
        node_name=node,
        agent_version="test",
        host=HostInfo(hostname=node, cpu_count=256, memory_total_mib=2_097_152, simulated=True),
        runtime=RuntimeInfo(kind="process"),
        gpus=[
            GpuInfo(
                index=i,
                uuid=uuid,
                model="NVIDIA A100-SXM4-80GB",
                memory_total_mib=81920,
                topology=GpuTopology(numa_node=i // 4, pcie_switch=f"sw{i // 2}", nvlink_group="nvswitch"),
                healthy=i not in unhealthy,
                health_reason=unhealthy.get(i),
            )
            for i, uuid in uuids.items()
        ],
    )


async def connect(token: str | None, origin: str | None = None) -> tuple[WebsocketCommunicator, bool, Any]:
    headers = []
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    communicator = WebsocketCommunicator(application(), "/ws/agent/", headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


async def greet(node: str) -> tuple[WebsocketCommunicator, Any]:
    token = await sync_to_async(issue_node_token)(await Node.objects.aget(name=node), None)
    communicator, connected, _ = await connect(token)
    assert connected
    await communicator.send_to(text_data=encode(hello(node)))
    welcome = decode_from_portal(await communicator.receive_from(timeout=10))
    desired = decode_from_portal(await communicator.receive_from(timeout=10))
    assert welcome.type == "welcome" and desired.type == "desired_set"
    return communicator, desired


async def test_it_refuses_missing_wrong_and_user_tokens_and_browsers(users) -> None:  # type: ignore[no-untyped-def]
    node_token = await sync_to_async(issue_node_token)(await Node.objects.aget(name="a100-node-1"), None)
    _, user_token = await sync_to_async(create_api_token)(users["alice"], "x")
    for token, origin in [
        (None, None),
        ("gpp_wrong", None),
        (user_token, None),
        (node_token, "http://evil.example"),
    ]:
        communicator, connected, code = await connect(token, origin)
        assert not connected and code == 4401, (token, origin)
    communicator, connected, _ = await connect(node_token)
    assert connected
    await communicator.disconnect()


async def test_the_first_message_must_be_a_hello_for_the_tokens_node(users) -> None:  # type: ignore[no-untyped-def]
    token = await sync_to_async(issue_node_token)(await Node.objects.aget(name="a100-node-1"), None)
    communicator, _, _ = await connect(token)
    await communicator.send_to(text_data=encode(Heartbeat(uptime_s=1)))
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    communicator, _, _ = await connect(token)
    await communicator.send_to(text_data=encode(hello("a100-node-2")))  # another node's name
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    assert (await Node.objects.aget(name="a100-node-2")).state == "not-ready"


async def test_hello_takes_the_inventory_and_marks_the_node_ready(users) -> None:  # type: ignore[no-untyped-def]
    communicator, desired = await greet("a100-node-1")
    assert desired.attempts == []
    node = await Node.objects.aget(name="a100-node-1")
    assert node.state == "ready" and node.cpu == 256 and node.memory_gb == 2048
    gpus = [g async for g in Gpu.objects.filter(node=node).order_by("index")]
    assert [g.uuid for g in gpus] == [f"GPU-a100-node-1-real-{i}" for i in range(8)]
    assert {g.model for g in gpus} == {"A100"}
    assert [g.pcie_switch for g in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    await communicator.disconnect()


def place_a_job(alice: Any) -> Job:
    from rest_framework.test import APIClient

    from scheduler.tasks import run_cycle

    client = APIClient()
    client.force_authenticate(alice)
    spec = {
        "name": "j",
        "vc": "vision",
        "resources": {"gpus": 8, "gpu_model": "A100", "cpu": 8, "memory_gb": 8},
        "command": "true",
        "replicas": 2,
    }
    job_id = client.post("/api/v1/jobs/", spec, format="json").json()["id"]
    assert run_cycle()["started"] == 1
    return Job.objects.get(pk=job_id)


def status(attempt_id: str, job: Job, state: AttemptState, generation: int, **extra: Any) -> str:
    return encode(
        AttemptStatus(
            attempt_id=attempt_id,
            job_id=str(job.pk),
            state=state,
            generation=generation,
            time=utc_now(),
            **extra,
        )
    )


async def state_of(job: Job) -> str:
    return (await Job.objects.aget(pk=job.pk)).state


async def test_reports_move_the_job_and_duplicates_late_and_foreign_ones_change_nothing(
    users, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    # Each node is told about its own replica, with the GPUs it holds there.
    desired_one = decode_from_portal(await one.receive_from(timeout=10))
    desired_two = decode_from_portal(await two.receive_from(timeout=10))
    (replica_one,) = desired_one.attempts
    (replica_two,) = desired_two.attempts
    assert len(replica_one.gpus) == 8 and replica_one.gpus[0].uuid == "GPU-a100-node-1-real-0"
    assert replica_one.attempt_id != replica_two.attempt_id and replica_one.job_id == str(job.pk)

    # Node one may not report on node two's replica.
    await one.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, 1))
    await one.send_to(text_data=status(replica_one.attempt_id, job, AttemptState.RUNNING, 1))
    await one.send_to(text_data=encode(Heartbeat(uptime_s=2)))
    await one.receive_nothing(timeout=0.5)
    assert await state_of(job) == "starting"  # one of two replicas running
    await two.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, 1))
    await two.receive_nothing(timeout=0.5)
    assert await state_of(job) == "running"
    # A late 'starting' and a duplicate 'running' change nothing.
    await two.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.STARTING, 0))
    await two.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, 1))
    for _ in range(2):  # the same log chunk twice
        await one.send_to(
            text_data=encode(
                LogChunk(attempt_id=replica_one.attempt_id, stream="stdout", seq=0, text="a\nb\n")
            )
        )
    await one.send_to(
        text_data=status(
            replica_one.attempt_id, job, AttemptState.EXITED, 2, exit_code=0, reason=ExitReason.SUCCEEDED
        )
    )
    await two.send_to(
        text_data=status(
            replica_two.attempt_id, job, AttemptState.EXITED, 2, exit_code=0, reason=ExitReason.SUCCEEDED
        )
    )
    # Both nodes are told that nothing should run any more.
    assert decode_from_portal(await one.receive_from(timeout=10)).attempts == []
    assert decode_from_portal(await two.receive_from(timeout=10)).attempts == []
    assert await state_of(job) == "succeeded"
    # A stale report after the end changes nothing.
    await two.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, 9))
    await two.receive_nothing(timeout=0.5)
    assert await state_of(job) == "succeeded"
    assert [line.text async for line in LogLine.objects.order_by("seq")] == ["a", "b"]
    events = [e async for e in (await Job.objects.aget(pk=job.pk)).events.values_list("to_state", flat=True)]
    assert events == ["pending", "scheduled", "starting", "running", "succeeded"]
    await one.disconnect()
    await two.disconnect()


async def test_a_gpu_failure_marks_it_unhealthy_and_requeues_its_job(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    from agents.protocol import GpuSample, TelemetryBatch
    from portal.jobs.models import JobAttempt

    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica_one,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    (replica_two,) = decode_from_portal(await two.receive_from(timeout=10)).attempts
    await one.send_to(text_data=status(replica_one.attempt_id, job, AttemptState.RUNNING, 1))
    await two.send_to(text_data=status(replica_two.attempt_id, job, AttemptState.RUNNING, 1))
    await two.receive_nothing(timeout=0.5)
    assert await state_of(job) == "running"
    samples = [
        GpuSample(
            gpu_uuid=f"GPU-a100-node-1-real-{i}",
            time=utc_now(),
            utilization_pct=90.0,
            healthy=i != 3,
            health_reason="xid 79 (fallen off the bus)" if i == 3 else None,
        )
        for i in range(8)
    ]
    await one.send_to(text_data=encode(TelemetryBatch(samples=samples)))
    # Both nodes are told to stop the gang: its GPUs are released, and it waits for a new attempt.
    assert decode_from_portal(await one.receive_from(timeout=10)).attempts == []
    assert decode_from_portal(await two.receive_from(timeout=10)).attempts == []
    gpu = await Gpu.objects.aget(uuid="GPU-a100-node-1-real-3")
    assert not gpu.healthy and "xid 79" in gpu.health_reason
    assert await state_of(job) == "pending"
    attempt = await JobAttempt.objects.aget(job=job)
    assert attempt.state == "lost" and "xid 79" in attempt.end_reason
    healthy_others = await Gpu.objects.filter(node__name="a100-node-1", healthy=True).acount()
    assert healthy_others == 7
    await one.disconnect()
    await two.disconnect()


async def test_an_idle_agent_connection_stays_open(users) -> None:  # type: ignore[no-untyped-def]
    """Regression: with redis-py's 5 s default read timeout the channel layer's blocking receive
    failed after 5 idle seconds and took the websocket down with it."""
    communicator, _ = await greet("a100-node-1")
    assert await communicator.receive_nothing(timeout=6.5)
    await communicator.send_to(text_data=encode(Heartbeat(uptime_s=7)))
    await communicator.receive_nothing(timeout=0.5)
    node = await Node.objects.aget(name="a100-node-1")
    assert node.state == "ready"
    # The socket still receives pushes from the portal.
    from portal.agentgw.outbox import node_group
    from portal.lib.channels import group_send

    await sync_to_async(group_send)(node_group(node.pk), {"type": "desired.changed"})
    assert decode_from_portal(await communicator.receive_from(timeout=10)).type == "desired_set"
    await communicator.disconnect()


async def test_a_lost_desired_set_hint_is_made_good_on_a_heartbeat(users, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The push after a change is a hint. When it is lost (the node's revision moved on but no
    message came, as when Redis restarts), the agent's next heartbeat past the recheck interval
    gets it the newest desired set."""
    from portal.agentgw import consumers

    communicator, _ = await greet("a100-node-1")
    node = await Node.objects.aget(name="a100-node-1")
    await Node.objects.filter(pk=node.pk).aupdate(desired_revision=node.desired_revision + 5)
    monkeypatch.setattr(consumers, "DESIRED_RECHECK_S", 0.0)
    await communicator.send_to(text_data=encode(Heartbeat(uptime_s=1)))
    desired = decode_from_portal(await communicator.receive_from(timeout=10))
    assert desired.type == "desired_set" and desired.revision == node.desired_revision + 5
    await communicator.send_to(text_data=encode(Heartbeat(uptime_s=2)))
    assert await communicator.receive_nothing(timeout=0.5)  # up to date: nothing more
    await communicator.disconnect()


async def test_telemetry_is_kept_per_attempt_and_only_for_the_reporting_nodes_gpus(
    users, paused_loop
) -> None:  # type: ignore[no-untyped-def]
    """Samples are buffered and written for all agents at once; closing the connection writes
    what is buffered. A node's samples count only for the replica placed on that node, and reach
    the browsers watching the job."""
    import json

    from agents.protocol import GpuSample, TelemetryBatch
    from portal.agentgw.desired import parse_agent_attempt_id
    from portal.jobs.models import TelemetrySample
    from portal.lib.redis import get_redis

    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica_one,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    decode_from_portal(await two.receive_from(timeout=10))
    node_one = await Node.objects.aget(name="a100-node-1")
    await Node.objects.filter(pk=node_one.pk).aupdate(state="not-ready", state_reason="no heartbeat for 4 s")

    def batch(gpus: list[str], utilization: float) -> str:
        return encode(
            TelemetryBatch(
                samples=[GpuSample(gpu_uuid=g, time=utc_now(), utilization_pct=utilization) for g in gpus]
            )
        )

    from django.test import Client

    def session_cookie() -> bytes:
        client = Client()
        client.force_login(users["alice"])
        return f"sessionid={client.cookies['sessionid'].value}".encode()

    browser = WebsocketCommunicator(
        application(),
        "/ws/live/",
        headers=[(b"cookie", await sync_to_async(session_cookie)()), (b"origin", b"http://localhost")],
    )
    assert (await browser.connect())[0]
    await browser.send_json_to({"subscribe": "job", "id": job.pk})
    assert (await browser.receive_json_from(timeout=10))["subscribed"] == "job"

    own = [f"GPU-a100-node-1-real-{i}" for i in range(8)]
    await one.send_to(text_data=batch(own, 50.0))
    await one.send_to(text_data=batch(own, 70.0))
    # Node two's GPUs, reported by node one: the job holds them, but not on node one.
    await one.send_to(text_data=batch(["GPU-a100-node-2-real-0"], 99.0))
    await one.send_to(text_data=encode(Heartbeat(uptime_s=3)))
    await one.disconnect()

    rows = [
        (s.attempt_id, s.gpu_uuid, s.utilization_pct)
        async for s in TelemetrySample.objects.filter(attempt__job=job).order_by("gpu_uuid", "time")
    ]
    assert len(rows) == 16 and {r[1] for r in rows} == set(own)
    attempt_pk, _replica = parse_agent_attempt_id(replica_one.attempt_id) or (None, None)
    assert {r[0] for r in rows} == {attempt_pk}
    assert [r[2] for r in rows[:2]] == [50.0, 70.0]
    latest = await sync_to_async(get_redis().hgetall)(f"telemetry:node:{node_one.pk}")
    assert json.loads(latest[own[0].encode()])["utilization_pct"] == 70.0
    assert (await Node.objects.aget(pk=node_one.pk)).state == "ready"  # the heartbeat counted
    pushed = []
    while len(pushed) < 16:
        message = await browser.receive_json_from(timeout=10)
        if message.get("kind") == "telemetry":
            pushed += message["samples"]
    assert {p["gpu_uuid"] for p in pushed} == set(own)
    await browser.disconnect()
    await two.disconnect()


async def test_output_with_nul_bytes_is_kept_and_the_connection_stays(users, paused_loop) -> None:  # type: ignore[no-untyped-def]
    # A job may print anything. PostgreSQL text cannot hold NUL, and the chunk used to fail its
    # insert, close the node's connection and lose every line it carried.
    one, _ = await greet("a100-node-1")
    two, _ = await greet("a100-node-2")
    job = await sync_to_async(place_a_job)(users["alice"])
    (replica,) = decode_from_portal(await one.receive_from(timeout=10)).attempts
    await one.send_to(text_data=status(replica.attempt_id, job, AttemptState.RUNNING, 1))
    text = "\rprogress 50%\rprogress 100%\n\x00nul \x1b[31mred\x1b[0m\nafter\n"
    chunk = LogChunk(attempt_id=replica.attempt_id, stream="stdout", seq=0, text=text)
    await one.send_to(text_data=encode(chunk))
    await one.send_to(text_data=encode(Heartbeat(uptime_s=2)))
    assert await one.receive_nothing(timeout=0.5)  # still connected: no close frame
    lines = [line.text async for line in LogLine.objects.order_by("seq")]
    assert lines == ["\rprogress 50%\rprogress 100%", "\ufffdnul \x1b[31mred\x1b[0m", "after"]
    await one.disconnect()
    await two.disconnect()


@pytest.fixture
def suspended_job(two_running) -> tuple[str, str, int]:  # type: ignore[no-untyped-def]  # noqa: F811
    """A time-sliced job suspended for another's turn: its node's name, its replica's agent-side
    attempt id, and its id."""
    from portal.agentgw.desired import agent_attempt_id
    from portal.jobs.models import Allocation, JobAttempt
    from scheduler.tasks import run_cycle
    from tests.portal.store_helpers import submit
    from tests.portal.test_time_slicing_store import every_cycle_a_new_turn, state

    alice, sliced, _ = two_running
    submit(alice, "waiting", time_sliceable=True)
    run_cycle(every_cycle_a_new_turn())
    assert state(sliced) == "suspended"
    attempt = JobAttempt.objects.get(job_id=sliced)
    node = Allocation.objects.filter(attempt=attempt).first().node
    return node.name, agent_attempt_id(attempt, 0), sliced


async def hello_replaying_an_exit(node_name: str, attempt_id: str, job_id: int) -> Any:
    """The node's agent reconnects and its hello lists the replica as exited 0; returns the
    first message the portal answers with."""
    from agents.protocol.messages import ReportedAttempt

    node = await Node.objects.aget(name=node_name)
    uuids = {g.index: g.uuid async for g in Gpu.objects.filter(node=node)}
    communicator, connected, _ = await connect(await sync_to_async(issue_node_token)(node, None))
    assert connected
    greeting = hello(node_name, uuids)
    greeting.attempts.append(
        ReportedAttempt(
            attempt_id=attempt_id,
            job_id=str(job_id),
            state=AttemptState.EXITED,
            generation=5,
            exit_code=0,
            reason=ExitReason.SUCCEEDED,
        )
    )
    await communicator.send_to(text_data=encode(greeting))
    answer = decode_from_portal(await communicator.receive_from(timeout=10))
    await communicator.disconnect()
    return answer


async def test_a_hello_replaying_the_exit_of_a_suspended_job_is_welcomed(suspended_job) -> None:  # type: ignore[no-untyped-def]
    """The exit of a frozen process ends its job. It used to raise (no move from suspended to
    succeeded), which closed the connection, and every hello replayed it: the node was never
    welcomed again."""
    node_name, attempt_id, job_id = suspended_job
    assert (await hello_replaying_an_exit(node_name, attempt_id, job_id)).type == "welcome"
    assert (await Job.objects.aget(pk=job_id)).state == "succeeded"


async def test_a_report_the_state_table_refuses_is_dropped_and_the_node_stays_connected(
    suspended_job, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A safety net: should a report ever call for a move the table lacks (as suspended ->
    succeeded once did), that report is dropped and logged, and the node is still welcomed and
    heard, rather than losing its connection on each try."""
    from portal.jobs.choices import ALLOWED_TRANSITIONS, JobState
    from portal.jobs.models import JobAttempt

    node_name, attempt_id, job_id = suspended_job
    monkeypatch.setitem(
        ALLOWED_TRANSITIONS, JobState.SUSPENDED, frozenset({JobState.RUNNING, JobState.CANCELLED})
    )
    assert (await hello_replaying_an_exit(node_name, attempt_id, job_id)).type == "welcome"
    assert (await Job.objects.aget(pk=job_id)).state == "suspended"
    attempt = await JobAttempt.objects.aget(job_id=job_id)
    assert "0" not in attempt.replica_states  # the report's transaction was rolled back
