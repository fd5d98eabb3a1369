"""EndTransaction, and the transaction ids that make it stateless.

A transaction id the proxy gives a client (in the send result, and in a
RecoverOrphanedTransactionCommand) names everything END_TRANSACTION needs: the broker, the
half message's commit-log offset and its offset in the half queue, and its unique id. Any
proxy can therefore commit or roll back any transaction; the Apache proxy instead keeps
these in memory, keyed by producer group and transaction id, on the proxy that sent the
half message or relayed the check.
"""

from __future__ import annotations

import base64
import binascii

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, Code, ok
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.processor.transaction import HalfMessageRef, TransactionProcessor
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE

_PREFIX = "t1"


def encode_transaction_id(ref: HalfMessageRef) -> str:
    raw = " ".join(
        (
            _PREFIX,
            ref.broker,
            str(ref.commit_log_offset),
            str(ref.tran_state_table_offset),
            ref.msg_id,
        )
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_transaction_id(text: str) -> HalfMessageRef:
    """Raises ApiError INVALID_TRANSACTION_ID for anything this proxy did not make."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        prefix, broker, commit_log, tran_state, msg_id = raw.split(" ")
        if prefix != _PREFIX or not broker or not msg_id:
            raise ValueError(prefix)
        return HalfMessageRef(broker, int(commit_log), int(tran_state), msg_id)
    except (binascii.Error, UnicodeError, ValueError):
        raise ApiError(Code.INVALID_TRANSACTION_ID, "transaction id is not valid") from None


_RESOLUTIONS = {
    pb.TransactionResolution.COMMIT: TRANSACTION_COMMIT_TYPE,
    pb.TransactionResolution.ROLLBACK: TRANSACTION_ROLLBACK_TYPE,
}


class TransactionActivity:
    def __init__(self, transactions: TransactionProcessor) -> None:
        self.transactions = transactions

    async def end_transaction(
        self, request: api.EndTransactionRequest, context: Context
    ) -> api.EndTransactionResponse:
        topic = check.validate_topic(request.topic.name)
        if check.is_blank(request.transaction_id):
            raise ApiError(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        ref = decode_transaction_id(request.transaction_id)
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            # UNKNOWN: nothing to tell the broker; it will ask again.
            return api.EndTransactionResponse(status=ok())
        from_check = request.source == pb.TransactionSource.SOURCE_SERVER_CHECK
        try:
            await self.transactions.end(
                ref,
                group=topic,
                topic=topic,
                resolution=resolution,
                transaction_id=ref.msg_id,
                from_check=from_check,
            )
        except LookupError as exc:
            raise ApiError(Code.INVALID_TRANSACTION_ID, str(exc)) from None
        except RemotingError as exc:
            raise ApiError(Code.PROXY_TIMEOUT, f"{ref.broker}: {exc}") from None
        return api.EndTransactionResponse(status=ok())
