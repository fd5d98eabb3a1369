"""The queue listing QueryRoute sends and SendMessage maps back: interleaved across brokers."""

from proxy.brokers import BrokerRoute, TopicRoute


def broker(name: str, queues: int) -> BrokerRoute:
    return BrokerRoute(name, f"{name}:10911", queues, queues, 6)


def test_queues_interleave_brokers_so_round_robin_visits_each_in_turn():
    route = TopicRoute("T", (broker("a", 2), broker("b", 3), broker("c", 2)))
    listing = [(q.broker.name, q.queue_id) for q in route.queues]
    assert listing == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1), ("b", 2)]
    # Any window of len(brokers) consecutive positions names every broker (while all have
    # queues left): a client taking queues round-robin does not stick to one broker.
    assert {name for name, _ in listing[2:5]} == {"a", "b", "c"}


def test_no_brokers_no_queues():
    assert TopicRoute("T", ()).queues == []
