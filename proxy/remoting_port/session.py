"""One client connection of the remoting port, and its own connections to the brokers.

Each client connection gets a connection of its own to each broker it sends to. A broker
then sees every client on a connection of its own, as it would without the proxy: it keeps
a client's registration (producer group, consumer group) per connection, and it sends its
requests for a client (a transaction check, a notice that a group's consumers changed, a
request for the client's running info) on that client's connection. The session relays
those to the client and its answer back, so no table of who is where is needed.

Each of those connections holds a descriptor of the process's open-files budget
(``proxy/descriptors.py``), shared with every front and the registrations: a client that
would take a broker connection past it gets SYSTEM_ERROR for that request, and the proxy's
own connections keep working.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from proxy.descriptors import DescriptorBudget
from proxy.remoting.client import RemotingClient, RemotingError, RequestHook
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.server import ConnectionClosedError

log = logging.getLogger(__name__)

# How long a client gets to answer a broker's request relayed to it: the broker's own wait
# for a client's answer (a transaction check is one-way; running info waits 10 s at most).
CLIENT_ANSWER_TIMEOUT_S = 10.0

# Asks the client on a connection (the port's server): request, timeout -> its response.
AskClient = Callable[[RemotingConnection, RemotingCommand, float], Awaitable[RemotingCommand]]
TellClient = Callable[[RemotingConnection, RemotingCommand], bool]


class ClientSession:
    """The brokers' side of one client connection."""

    def __init__(
        self,
        conn: RemotingConnection,
        ask: AskClient,
        tell: TellClient,
        *,
        connect_timeout_s: float = 3.0,
        request_hook: RequestHook | None = None,
        budget: DescriptorBudget | None = None,
    ) -> None:
        """``request_hook`` signs each request sent on to a broker (the proxy's own
        credentials, once the proxy has checked the client's); each broker connection
        holds a descriptor of ``budget``."""
        self._budget = budget
        self._held = 0  # descriptors of the budget this session's connections hold
        self.conn = conn
        self._request_hook = request_hook
        self._ask = ask
        self._tell = tell
        self._connect_timeout_s = connect_timeout_s
        self._upstreams: dict[str, RemotingClient] = {}  # by broker name
        self._retired: list[RemotingClient] = []  # of brokers that moved; closed with us
        # The last heartbeat each broker took from this client: (its body, when).
        self.heartbeats: dict[str, tuple[bytes, float]] = {}
        self.closed = False

    @property
    def brokers(self) -> list[str]:
        """The brokers this client has sent to."""
        return list(self._upstreams)

    def _upstream(self, broker: str, address: str) -> RemotingClient | None:
        """This client's connection to ``broker``; None when the budget has no descriptor
        for a new one."""
        client = self._upstreams.get(broker)
        if client is None or client.address != address:
            if self._budget is not None:
                if not self._budget.take(1):
                    return None
                self._held += 1
            if client is not None:  # the broker moved: calls on the old one may still end
                self._retired.append(client)
            client = RemotingClient(
                address,
                connect_timeout=self._connect_timeout_s,
                server_handler=self._from_broker,
                request_hook=self._request_hook,
            )
            self._upstreams[broker] = client
        return client

    async def forward(
        self, broker: str, address: str, cmd: RemotingCommand, timeout_s: float
    ) -> RemotingCommand | None:
        """Send ``cmd`` to ``broker`` on this client's connection to it; its response, or
        None for a one-way request. A broker that cannot be reached, or does not answer in
        time, is the client's SYSTEM_ERROR: the 4.x producer then retries another broker."""
        upstream = self._upstream(broker, address)
        if upstream is None:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                remark="the proxy holds as many connections as its open-files limit allows",
            )
        out = replace(cmd, ext_fields=dict(cmd.fields))  # invoke sets its own opaque
        try:
            if cmd.is_oneway:
                await upstream.invoke_oneway(out, timeout_s)
                return None
            return await upstream.invoke(out, timeout_s)
        except RemotingError as exc:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR, remark=f"broker {broker} ({address}): {exc}"
            )

    def _from_broker(
        self, cmd: RemotingCommand
    ) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand] | None:
        """A broker's request on this client's connection: told to the client (one-way),
        or asked of it, its answer going back to the broker."""
        out = replace(cmd, ext_fields=dict(cmd.fields))
        if cmd.is_oneway:
            self._tell(self.conn, out)
            return None
        return self._relay_to_client(cmd, out)

    async def _relay_to_client(self, cmd: RemotingCommand, out: RemotingCommand) -> RemotingCommand:
        try:
            answer = await self._ask(self.conn, out, CLIENT_ANSWER_TIMEOUT_S)
        except (TimeoutError, ConnectionClosedError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=f"client: {exc}")
        return replace(answer, ext_fields=dict(answer.fields))

    async def close(self) -> None:
        self.closed = True
        upstreams = [*self._upstreams.values(), *self._retired]
        self._upstreams, self._retired = {}, []
        await asyncio.gather(*(c.close() for c in upstreams), return_exceptions=True)
        if self._budget is not None:
            self._budget.give(self._held)
        self._held = 0
