"""The demo cluster that `make up` loads: idempotent, so running it twice changes nothing."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from portal.accounts.choices import Role
from portal.accounts.models import Membership, Tenant, TotpDevice, hash_secret, new_secret
from portal.cluster.choices import NodeState, QueueingPolicy
from portal.cluster.models import Flavor, Gpu, Node, PriorityClass, Quota, VirtualCluster
from portal.cluster.services import write_secret_file
from portal.devstack import DEMO_ADMIN_TOTP_SECRET

# (name, value, preemptible, tenant admins only, description)
PRIORITY_CLASSES = [
    ("production", 1000, False, True, "Serving and deadline work; never preempted. Tenant admins only."),
    ("training", 500, True, False, "Regular training jobs."),
    ("dev", 100, True, False, "Interactive and debugging work."),
    ("opportunistic", 0, True, False, "Runs on idle GPUs; preempted first."),
]
DEFAULT_PRIORITY = "training"

# (size, A100 GPUs/CPU/GB, V100 GPUs/CPU/GB, max hours); a flavor gives per-replica resources.
FLAVORS = [
    ("s", (2, 64, 256), (2, 20, 128), 72),
    ("m", (4, 128, 512), (4, 40, 256), 168),
    ("l", (8, 256, 1024), (8, 80, 512), 336),
]

TENANTS = {
    "vision": ["vision-admin", "alice", "bob"],
    "speech": ["speech-admin", "carol", "dave"],
}
# VC name -> (tenant, policy, {model: (guaranteed, borrow limit, lending limit)}). Vision lends
# at most 4 of its V100, as many as speech may borrow: the limit shows, and holds no job back while
# every V100 is up.
VIRTUAL_CLUSTERS = {
    "vision": ("vision", QueueingPolicy.FIFO, {"A100": (8, 8, None), "V100": (8, 4, 4)}),
    "speech": ("speech", QueueingPolicy.LAS, {"A100": (8, 8, None), "V100": (8, 4, None)}),
}

# Simulated hosts: DGX-A100 (8x A100 80 GB, one NVSwitch fabric) and DGX-1 (8x V100 32 GB,
# hybrid cube-mesh seen as two NVLink groups of four); two PCIe switches per NUMA node.
NODES = [
    ("a100-node-1", "rack-1", "A100", 81920, 256, 2048, lambda i: 0),
    ("a100-node-2", "rack-1", "A100", 81920, 256, 2048, lambda i: 0),
    ("v100-node-1", "rack-2", "V100", 32768, 80, 512, lambda i: i // 4),
    ("v100-node-2", "rack-2", "V100", 32768, 80, 512, lambda i: i // 4),
]


def password_for(username: str) -> str:
    return f"{username}-pass"


def ensure_demo_authenticator(user: User) -> None:
    """An enrolled authenticator for the demo admin, so `make up` needs no enrollment step: the
    banner shows how to get its codes (`python -m portal.accounts.totp DEMO_ADMIN_TOTP_SECRET`)."""
    TotpDevice.objects.get_or_create(
        user=user, defaults={"secret": DEMO_ADMIN_TOTP_SECRET, "confirmed_at": timezone.now()}
    )


def ensure_user(username: str, staff: bool = False) -> User:
    user, created = User.objects.get_or_create(
        username=username, defaults={"is_staff": staff, "is_superuser": staff}
    )
    if created:
        user.set_password(password_for(username))
        user.save()
    return user


@transaction.atomic
def seed_demo(agent_token_dir: Path | None = None) -> None:
    ensure_demo_authenticator(ensure_user("admin", staff=True))
    for name, value, preemptible, admins_only, description in PRIORITY_CLASSES:
        PriorityClass.objects.update_or_create(
            name=name,
            defaults={
                "value": value,
                "preemptible": preemptible,
                "tenant_admins_only": admins_only,
                "description": description,
            },
        )
    PriorityClass.objects.exclude(name=DEFAULT_PRIORITY).update(is_default=False)
    PriorityClass.objects.filter(name=DEFAULT_PRIORITY).update(is_default=True)
    for size, a100, v100, hours in FLAVORS:
        for model, (gpus, cpu, mem) in (("A100", a100), ("V100", v100)):
            Flavor.objects.update_or_create(
                name=f"{size}-{model}",
                defaults={
                    "gpu_model": model,
                    "gpus": gpus,
                    "cpu": cpu,
                    "memory_gb": mem,
                    "max_runtime_hours": hours,
                },
            )
    for tenant_name, usernames in TENANTS.items():
        tenant, _ = Tenant.objects.get_or_create(
            name=tenant_name, defaults={"display_name": tenant_name.title()}
        )
        for username in usernames:
            role = Role.ADMIN if username.endswith("-admin") else Role.MEMBER
            Membership.objects.get_or_create(
                user=ensure_user(username), tenant=tenant, defaults={"role": role}
            )
    for vc_name, (tenant_name, policy, quotas) in VIRTUAL_CLUSTERS.items():
        vc, _ = VirtualCluster.objects.get_or_create(
            name=vc_name, defaults={"tenant": Tenant.objects.get(name=tenant_name), "queueing_policy": policy}
        )
        for model, (guaranteed, borrow, lending) in quotas.items():
            Quota.objects.get_or_create(
                virtual_cluster=vc,
                gpu_model=model,
                defaults={"guaranteed": guaranteed, "borrow_limit": borrow, "lending_limit": lending},
            )
    for name, rack, model, memory_mb, cpu, mem_gb, nvlink_group in NODES:
        node, _ = Node.objects.get_or_create(
            name=name, defaults={"rack": rack, "cpu": cpu, "memory_gb": mem_gb, "state": NodeState.NOT_READY}
        )
        for i in range(8):
            Gpu.objects.get_or_create(
                node=node,
                index=i,
                defaults={
                    "uuid": f"GPU-{name}-{i}",
                    "model": model,
                    "memory_mb": memory_mb,
                    "nvlink_group": nvlink_group(i),
                    "pcie_switch": i // 2,
                    "numa_node": i // 4,
                },
            )
        if agent_token_dir is not None:
            write_agent_token(node, agent_token_dir)


def write_agent_token(node: Node, directory: Path) -> None:
    """Gives the node a fresh agent token unless its token file exists (the hash is what is stored)."""
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / f"{node.name}.token"
    if token_file.exists() and node.token_hash == hash_secret(token_file.read_text().strip()):
        return
    raw = new_secret()
    write_secret_file(token_file, raw + "\n")
    Node.objects.filter(pk=node.pk).update(token_hash=hash_secret(raw))
