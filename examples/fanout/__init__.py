"""Events to three subscribers: the event (``Tick``), its subscribing services and the
publisher process. ``python -m tests.rig.fanout`` (in a checkout) runs them under faults:
publishers, relays and subscribers killed, the broker restarted, and then each subscriber
must hold every event exactly once. See :mod:`tests.rig.fanout`.
"""
