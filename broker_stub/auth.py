"""ACL 2.0's admin reads, served from a file: the users and access rules of a cluster with
ACL on, as a 5.5.0 broker answers AUTH_GET_USER, AUTH_LIST_USER, AUTH_GET_ACL and
AUTH_LIST_ACL, so that the proxy's ``security.auth_source = "cluster"`` runs on the stub
(``make run``, the fast tests). The stub does not check its own clients against them.

The file (``BrokerConfig.acl_file``, ``--acl-file``) is JSON in the brokers' own shapes,
re-read when it changes::

    {"users": [{"username": "alice", "password": "...", "userType": "Normal",
                "userStatus": "enable"}],
     "acls": [{"subject": "User:alice",
               "policies": [{"policyType": "Custom",
                             "entries": [{"resource": "Topic:orders", "actions": ["Pub"],
                                          "decision": "Allow"}]}]}]}
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson

from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection

log = logging.getLogger(__name__)


class AclFile:
    """The users and ACLs of one file, read again when its modification time changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.users: dict[str, dict[str, Any]] = {}
        self.acls: dict[str, dict[str, Any]] = {}

    def current(self) -> AclFile:
        try:
            st = os.stat(self.path)
        except OSError:
            return self  # gone: the last version read stays
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.path, "rb") as f:
                    data = orjson.loads(f.read())
                users = {u["username"]: u for u in data.get("users", [])}
                acls = {a["subject"]: a for a in data.get("acls", [])}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("ACL file %s cannot be read, the last version stays: %s", self.path, exc)
            else:
                self.users, self.acls = users, acls
            self._stamp = stamp
        return self


def _user_info(user: dict[str, Any]) -> bytes:
    defaults = {"userType": "Normal", "userStatus": "enable"}
    return orjson.dumps(dict(sorted({**defaults, **user}.items())))


class AuthHandlers:
    """AUTH_GET_USER, AUTH_LIST_USER, AUTH_GET_ACL and AUTH_LIST_ACL from an ``AclFile``;
    without one, the broker answers as one with no users."""

    def __init__(self, path: str | None) -> None:
        self._file = AclFile(path) if path else None

    def _acl(self) -> AclFile | None:
        return self._file.current() if self._file is not None else None

    def get_user(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        name = cmd.fields.get("username", "")
        if not name.strip():
            return cmd.make_response(ResponseCode.INVALID_PARAMETER, remark="The username is blank")
        acl = self._acl()
        user = acl.users.get(name) if acl else None
        answer = cmd.make_response(ResponseCode.SUCCESS)
        if user is not None:
            answer.body = _user_info(user)  # none: no such user
        return answer

    def list_users(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        part = cmd.fields.get("filter") or ""
        acl = self._acl()
        found = [u for name, u in (acl.users.items() if acl else ()) if part in name]
        answer = cmd.make_response(ResponseCode.SUCCESS)
        if found:
            answer.body = b"[" + b",".join(_user_info(u) for u in found) + b"]"
        return answer

    def get_acl(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        subject = cmd.fields.get("subject", "")
        acl = self._acl()
        if not subject.startswith("User:"):
            return cmd.make_response(ResponseCode.NO_PERMISSION, remark="The subject is null.")
        if acl is None or subject[len("User:") :] not in acl.users:
            return cmd.make_response(ResponseCode.NO_PERMISSION, remark="The subject is not exist.")
        answer = cmd.make_response(ResponseCode.SUCCESS)
        rules = acl.acls.get(subject)
        if rules is not None:
            answer.body = orjson.dumps(rules)
        return answer

    def list_acls(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        subject_part = cmd.fields.get("subjectFilter") or ""
        acl = self._acl()
        found = [a for s, a in (acl.acls.items() if acl else ()) if subject_part in s]
        answer = cmd.make_response(ResponseCode.SUCCESS)
        if found:
            answer.body = orjson.dumps(found)
        return answer
