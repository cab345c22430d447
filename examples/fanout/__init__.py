"""Events to three subscribers under faults: ``python -m saga.examples.fanout``.

Two publishers write numbered events (``Tick``) in their own transactions; two relays
publish them; three subscribing services (``audit``, ``billing``, ``reporting``), each
on its own database with a relay of its own, write one row per event. While events flow,
publishers, relays and subscribers are killed with SIGKILL (a supervisor starts them
again) and the broker is restarted once: a private RabbitMQ node, or the private
PostgreSQL cluster that holds the PostgreSQL broker and every database. In the end each
subscriber must hold every event exactly once. See :mod:`saga.examples.fanout.run`.
"""
