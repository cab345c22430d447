"""The saga that ``bench.three_step_saga`` runs: three remote steps doing the peers' writes.

Like a Celery chain of three tasks or a DBOS workflow of three transactional steps, each
step updates a random ``accounts`` row and logs itself in ``step_log``; here each step is a
command to the ``steps`` service (its own database) and a reply back to the saga's home.
Started with ``saga consume bench._saga_app:registry`` and ``bench._saga_app:service``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from pydantic import BaseModel

from bench.workload import LOG, UPDATE
from saga import HandlerContext, Saga, SagaRegistry, Service


class Run(BaseModel):
    run: int
    accounts: list[int]


class ApplyStep(BaseModel):
    run: int
    step: int
    account: int


def _command(number: int) -> Callable[[Run], ApplyStep]:
    def build(data: Run) -> ApplyStep:
        return ApplyStep(run=data.run, step=number, account=data.accounts[number - 1])

    return build


three_steps = Saga("three_steps", data=Run)
for _number in (1, 2, 3):
    three_steps.remote(f"step_{_number}", service="steps", command=_command(_number))

registry = SagaRegistry("runs")
registry.register(three_steps)

service = Service("steps")


@service.handler(ApplyStep)
def apply_step(tx: psycopg.Connection[Any], cmd: ApplyStep, ctx: HandlerContext) -> None:
    tx.execute(UPDATE, (cmd.account,))
    tx.execute(LOG, (cmd.run, cmd.step))
