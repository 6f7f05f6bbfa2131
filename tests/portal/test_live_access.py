"""A live socket does not outlive the access it was opened with (reliability-security.md b.3.1):
a sign-out closes that session's sockets, a membership removed or an account changed by an
admin closes all of the user's; a browser still signed in reconnects and sees what it may now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.utils import timezone

from portal.accounts.models import Membership
from tests.portal.test_live_hub import live_socket, signed_in

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def closed_with(communicator: WebsocketCommunicator) -> int:
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return int(output["code"])


async def test_a_sign_out_closes_that_sessions_sockets_only(users: Any) -> None:
    laptop = await sync_to_async(signed_in)(users["alice"])
    phone = await sync_to_async(signed_in)(users["alice"])
    on_laptop, on_phone = await live_socket(laptop), await live_socket(phone)
    await sync_to_async(laptop.logout)()
    assert await closed_with(on_laptop) == 4403
    assert await on_phone.receive_nothing(timeout=0.5)
    await on_phone.disconnect()


async def test_losing_a_membership_or_an_admins_change_closes_every_socket(users: Any) -> None:
    bob = await sync_to_async(signed_in)(users["bob"])
    first, second = await live_socket(bob), await live_socket(bob)
    other = await live_socket(await sync_to_async(signed_in)(users["carol"]))
    await Membership.objects.filter(user=users["bob"]).adelete()
    assert [await closed_with(first), await closed_with(second)] == [4403, 4403]
    assert await other.receive_nothing(timeout=0.5)  # another user's sockets stay

    carol = users["carol"]
    await sync_to_async(signed_in)(carol)  # a sign-in saves last_login only: nothing closes
    assert await other.receive_nothing(timeout=0.5)
    carol.is_active = False
    await carol.asave()
    assert await closed_with(other) == 4403


async def test_a_socket_closes_when_its_session_expires(users: Any) -> None:
    """A session's expiry is the end of its sign-in: a socket opened before does not outlive it."""
    expiring = await sync_to_async(signed_in)(users["alice"])
    lasting = await sync_to_async(signed_in)(users["alice"])
    await Session.objects.filter(session_key=expiring.cookies["sessionid"].value).aupdate(
        expire_date=timezone.now() + timedelta(seconds=1)
    )
    on_expiring, on_lasting = await live_socket(expiring), await live_socket(lasting)
    assert await on_expiring.receive_nothing(timeout=0.3)
    assert await closed_with(on_expiring) == 4403
    assert await on_lasting.receive_nothing(timeout=0.5)
    await on_lasting.disconnect()
