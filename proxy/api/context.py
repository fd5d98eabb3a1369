"""The servicer context grpc.aio hands every RPC, typed once for all of ``proxy/api``."""

from __future__ import annotations

from typing import TypeAlias

import grpc
from google.protobuf.message import Message

# grpc.aio does not parameterise the context at run time, and the generated servicer is
# untyped: the activities read the request's metadata and deadline, and the streaming
# RPCs write their responses, all of them protobuf messages.
Context: TypeAlias = grpc.aio.ServicerContext[Message, Message]
