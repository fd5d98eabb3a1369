"""The process's open-files budget: the descriptors that whatever a client makes the proxy
open may hold, one budget for the whole process.

A client makes the proxy open descriptors by connecting (a front's relay holds three: the
client's socket and both ends of its loopback connection to the server behind the front)
and by registering with the brokers (a registration slot's connection to a broker holds
one, ``processor/registrations.py``). Each of those takes its descriptors from the one
``DescriptorBudget`` of its process, ``process_budget()``, before it opens them, and
gives them back once they are closed; what the budget cannot give is refused (the client
closed, the registration not made), counted by whoever asked. The gRPC front, every front
of the remoting port and the registrations share it, so together they never hold more than
the open-files soft limit leaves after ``FD_RESERVE``: the brokers' own connections, the
name servers', the event log's files and gRPC's own keep working whatever the clients do.

The budget is made from the soft limit at its first use, after ``proxy.loop`` raised the
limit (the entry points do that before they build the proxy); a worker process has its
own, as it has its own limit.
"""

from __future__ import annotations

from dataclasses import dataclass

# Descriptors kept out of the budget for the rest of the process (broker and name server
# connections, the event log, gRPC's own): this many, or an eighth of the limit if that is
# more.
FD_RESERVE = 256
# Where there is no such limit (not POSIX, or unlimited): a budget nothing reaches.
UNLIMITED = 1 << 30


def budget_for(soft_limit: int) -> int:
    """The descriptors a soft open-files limit leaves for the budget (``FD_RESERVE``
    kept), at least one relay's worth so that a tiny limit still serves a client."""
    return max(3, soft_limit - max(FD_RESERVE, soft_limit // 8))


def soft_limit_budget() -> int:
    """``budget_for`` the process's open-files soft limit now."""
    try:
        import resource
    except ImportError:
        return UNLIMITED
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED
    return budget_for(soft)


@dataclass
class DescriptorBudget:
    """``total`` descriptors, taken (``take``) before a connection opens and given back
    (``give``) once it is closed. Not thread-safe: the event loop's thread uses it."""

    total: int
    held: int = 0
    refused: int = 0  # takes that did not fit

    @property
    def free(self) -> int:
        return self.total - self.held

    def take(self, n: int) -> bool:
        """Whether ``n`` more descriptors fit; if they do, they are held from now on."""
        if n > self.free:
            self.refused += 1
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        """Hand back ``n`` descriptors taken before (their connection is closed)."""
        self.held = max(0, self.held - n)

    def status(self) -> dict[str, int]:
        return {"total": self.total, "held": self.held, "refused": self.refused}


_process: DescriptorBudget | None = None


def process_budget() -> DescriptorBudget:
    """The budget of this process, made from its soft limit at the first call."""
    global _process
    if _process is None:
        _process = DescriptorBudget(soft_limit_budget())
    return _process
