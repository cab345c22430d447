"""``saga.examples``: the applications built on the framework that ship with it (the order
saga of ``saga demo``) and the fan-out of events (in a checkout only)."""

from saga.namespace import refuse_bare_name

refuse_bare_name(__name__, "saga.examples")
