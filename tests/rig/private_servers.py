"""The servers a chaos run starts for itself: a Redis, a PostgreSQL, a RabbitMQ cluster,
a PgBouncer in front of the run's PostgreSQL."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.rig.pgbouncer_server import PgBouncerServer
from tests.rig.postgres_server import PostgresServer
from tests.rig.rabbitmq_cluster import RabbitCluster
from tests.rig.redis_server import RedisServer

ADMIN_URL = os.environ.get(
    "SAGA_CHAOS_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class PrivateServers:
    """The servers a run starts for itself (and may crash, but for PgBouncer): none on
    the local RabbitMQ."""

    redis: RedisServer | None = None
    postgres: PostgresServer | None = None
    rabbitmq: RabbitCluster | None = None
    pgbouncer: PgBouncerServer | None = None

    @classmethod
    def start(cls, broker: str, *, pgbouncer: bool = False) -> PrivateServers:
        servers = cls()
        try:
            if broker.startswith("redis"):
                servers.redis = RedisServer(persistent=broker == "redis")
                servers.redis.start()
            elif broker == "postgres":
                servers.postgres = PostgresServer()
                servers.postgres.start()
            elif broker == "rabbitmq-cluster":
                servers.rabbitmq = RabbitCluster(size=3)
                servers.rabbitmq.start()
            if pgbouncer:
                backend = urlsplit(servers.admin_url)
                servers.pgbouncer = PgBouncerServer(
                    backend.hostname or "127.0.0.1", servers.postgres_port
                )
                servers.pgbouncer.start()
        except BaseException:
            servers.close()
            raise
        return servers

    @property
    def admin_url(self) -> str:
        return self.postgres.url if self.postgres else ADMIN_URL

    @property
    def postgres_port(self) -> int:
        return urlsplit(self.admin_url).port or 5432

    def url(self, name: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def service_url(self, name: str) -> str:
        """The URL the run's processes use for database ``name``: through PgBouncer if any."""
        url = self.url(name)
        return self.pgbouncer.url_for(url) if self.pgbouncer else url

    def admin(self, statement: str, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(name)))

    def close(self) -> None:
        for server in (self.pgbouncer, self.redis, self.postgres, self.rabbitmq):
            if server is not None:
                server.close()
