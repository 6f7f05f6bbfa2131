from django.db import models


class NodeState(models.TextChoices):
    """Ready nodes take new work; cordoned take none; draining take none and their jobs move away."""

    READY = "ready", "Ready"
    NOT_READY = "not-ready", "Not ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"


class QueueingPolicy(models.TextChoices):
    """How a virtual cluster orders its own pending jobs: the scheduler profile's order, or the
    name of a scheduler queue-sort plugin. A policy of its own also decides alone whether one
    of the VC's jobs may preempt another of the same priority class (FIFO: never)."""

    PROFILE = "", "The scheduler's order"
    FIFO = "fifo", "First in, first out"
    PRIORITY = "priority", "Priority class, then submit time"
    LAS = "las", "Least attained GPU service (Tiresias)"
    SHORTEST_FIRST = "sef", "Shortest expected first"


class StopPolicy(models.TextChoices):
    """An admin's stop of a virtual cluster (Kueue's stopPolicy), for maintenance or a budget
    run out: jobs may still be submitted and wait; the scheduler starts none of them."""

    OPEN = "", "Open"
    HOLD = "hold", "Hold: start no job (running ones go on)"
    HOLD_AND_DRAIN = "hold-and-drain", "Hold and drain: start no job, checkpoint and requeue running ones"


class IdlePolicy(models.TextChoices):
    """What happens to a job whose GPUs sit idle (allocated but unused) for too long."""

    NOTIFY = "notify", "Tell the owner and admins"
    STOP_OPPORTUNISTIC = "stop-opportunistic", "Tell, and stop jobs of priority 0 or lower"
