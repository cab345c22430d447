"""Least-privilege roles for the framework's tables (``saga db roles``).

Three group roles (NOLOGIN; grant them to your login roles):

- ``<prefix>_relay``: reads, defers and deletes outbox rows, quarantines the
  ones it cannot publish, and counts the events it published that nobody subscribes
  to. Nothing else: not the inbox, not any business table.
- ``<prefix>_service``: what a consumer service and app code need: inbox
  (delete too: a message retried later or dead-lettered gives its row back) and
  the replies kept with it,
  outbox (a consumer publishes the rows it wrote right after committing, as a
  relay would), dead letters (insert), sagas, step log, claim checks,
  guarded side effects, closed steps, the saga definitions its registry records at
  start-up, the subscriptions it declares and the events kept for its sagas. Grant it
  your own business tables as well.
- ``<prefix>_operator``: reads everything; replays and purges dead letters,
  resumes, cancels and signals sagas, prunes past retention.
"""

from __future__ import annotations

from psycopg import sql

from saga.db.sql import validate_schema

_TABLES = (
    "outbox",
    "inbox",
    "inbox_replies",
    "dead_letters",
    "dead_letter_replays",
    "saga_instances",
    "saga_steps",
    "claim_checks",
    "side_effects",
    "closed_steps",
    "schema_migrations",
    "dashboard_actions",
    "saga_definitions",
    "subscriptions",
    "events_unrouted",
    "early_events",
)


def role_names(prefix: str = "saga") -> dict[str, str]:
    validate_schema(prefix)
    return {kind: f"{prefix}_{kind}" for kind in ("relay", "service", "operator")}


def _grants(roles: dict[str, str]) -> list[tuple[str, str, str]]:
    """(privileges, table, role) triples."""
    relay, service, operator = roles["relay"], roles["service"], roles["operator"]
    grants = [
        ("SELECT, UPDATE, DELETE", "outbox", relay),
        ("INSERT", "dead_letters", relay),
        ("SELECT, INSERT, UPDATE", "events_unrouted", relay),
        ("SELECT, INSERT, DELETE", "inbox", service),
        ("SELECT, INSERT", "inbox_replies", service),
        # RETURNING reads, FOR UPDATE SKIP LOCKED needs UPDATE: publishing its own rows
        ("SELECT, INSERT, UPDATE, DELETE", "outbox", service),
        ("SELECT, INSERT", "dead_letters", service),
        ("SELECT, INSERT, UPDATE", "saga_instances", service),
        ("SELECT, INSERT", "saga_steps", service),
        ("SELECT, INSERT, DELETE", "claim_checks", service),
        ("SELECT, INSERT, UPDATE", "side_effects", service),
        ("SELECT, INSERT", "closed_steps", service),
        ("SELECT", "schema_migrations", service),
        ("SELECT, INSERT, UPDATE", "saga_definitions", service),  # recorded at start-up
        ("SELECT, INSERT, UPDATE, DELETE", "subscriptions", service),
        ("SELECT, INSERT, UPDATE", "events_unrouted", service),
        ("SELECT, INSERT, DELETE", "early_events", service),
    ]
    grants += [("SELECT", table, operator) for table in _TABLES]
    grants += [
        ("INSERT", "outbox", operator),
        ("UPDATE, DELETE", "dead_letters", operator),
        ("INSERT, DELETE", "dead_letter_replays", operator),
        ("UPDATE, DELETE", "saga_instances", operator),
        ("DELETE", "saga_steps", operator),
        ("DELETE", "inbox", operator),
        ("DELETE", "inbox_replies", operator),
        ("DELETE", "claim_checks", operator),
        ("DELETE", "closed_steps", operator),
        ("INSERT", "dashboard_actions", operator),  # what operators did from the dashboard
        ("DELETE", "early_events", operator),
    ]
    return grants


def statements(schema: str = "saga", prefix: str = "saga") -> list[sql.Composed]:
    """The SQL that creates the roles (if missing) and grants them exactly what they need."""
    validate_schema(schema)
    roles = role_names(prefix)
    result: list[sql.Composed] = []
    for role in roles.values():
        result.append(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) "
                "THEN CREATE ROLE {role} NOLOGIN; END IF; END $$"
            ).format(name=sql.Literal(role), role=sql.Identifier(role))
        )
        result.append(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
    for privileges, table, role in _grants(roles):
        result.append(
            sql.SQL("GRANT {} ON {}.{} TO {}").format(
                sql.SQL(privileges),
                sql.Identifier(schema),
                sql.Identifier(table),
                sql.Identifier(role),
            )
        )
    for role in (roles["service"], roles["relay"], roles["operator"]):
        result.append(
            sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
    return result
