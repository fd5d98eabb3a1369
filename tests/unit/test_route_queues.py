"""The queue listing QueryRoute sends, interleaved across brokers, and the queue the proxy
chooses for a send from it."""

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


def test_sends_take_writable_queues_in_turn_then_one_other_broker():
    from proxy.processor.producer import ProducerProcessor

    route = TopicRoute("T", (broker("a", 2), broker("b", 2), BrokerRoute("c", "c:1", 2, 2, 4)))
    producer = ProducerProcessor(pool=None, broker_timeout_s=1.0)  # type: ignore[arg-type]
    firsts = [producer._targets(route, None) for _ in range(4)]
    # c is read-only (perm 4): never chosen, never the fallback.
    assert [(t[0][0].name, t[0][1]) for t in firsts] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert all(len(t) == 2 and t[1][0].name != t[0][0].name and t[1][1] == -1 for t in firsts)


def test_a_message_group_goes_to_one_queue_on_every_proxy_and_nowhere_else():
    from proxy.processor.producer import ProducerProcessor

    route = TopicRoute("T", (broker("a", 4), broker("b", 4)))
    one, other = (ProducerProcessor(pool=None, broker_timeout_s=1.0) for _ in range(2))  # type: ignore[arg-type]
    for group in ("order-1", "order-2", "Ünïcode"):
        chosen = {tuple((b.name, q) for b, q in p._targets(route, group)) for p in (one, other)}
        chosen |= {tuple((b.name, q) for b, q in one._targets(route, group)) for _ in range(3)}
        [targets] = chosen  # the same every time, from either proxy
        assert len(targets) == 1  # no other broker: the group would lose its order there
    spread = {one._targets(route, f"g{i}")[0] for i in range(64)}
    assert len(spread) == 8  # groups spread over all the queues
