"""The rig that drives the example under faults, in a checkout only (never in the wheel):
the chaos run and its checker, the fault injector, the supervisor that restarts killed
processes, the private servers a run starts for itself (PostgreSQL, PgBouncer, Redis, a
RabbitMQ cluster), the operator's moves, and the fan-out of events under faults.
Used by the tests, the benchmarks and ``make chaos``."""
