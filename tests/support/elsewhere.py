"""A saga and its participant whose framework tables live in a schema other than ``saga``.

``saga consume tests.support.elsewhere:registry`` and ``...:ledger`` run them, with
``SAGA_SCHEMA`` set to :data:`SCHEMA` (the registry keeps its sagas there too).
"""

from __future__ import annotations

from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Saga, SagaRegistry, Service, StepFailed, Tx
from tests.support.sagas import effect

SCHEMA = "billing_fw"


class Invoice(BaseModel):
    invoice_id: str
    charge_id: str | None = None


class ChargeInvoice(BaseModel):
    invoice_id: str


class InvoiceCharged(BaseModel):
    charge_id: str


class VoidInvoice(BaseModel):
    invoice_id: str


invoice = Saga("invoice", data=Invoice)


@invoice.local("open_invoice", compensate="cancel_invoice")
def open_invoice(tx: Tx, d: Invoice) -> None:
    effect(tx, "open", d.invoice_id)


@invoice.local_compensation("cancel_invoice")
def cancel_invoice(tx: Tx, d: Invoice) -> None:
    effect(tx, "cancel", d.invoice_id)


invoice.remote(
    "charge",
    service="ledger",
    command=ChargeInvoice,
    reply=InvoiceCharged,
    on_reply=lambda d, r: d.model_copy(update={"charge_id": r.charge_id}),
    compensate=VoidInvoice,
)

registry = SagaRegistry("billing", schema=SCHEMA)
registry.register(invoice)

ledger = Service("ledger", retry=RetryPolicy(immediate_attempts=1, delays=()))


@ledger.handler(ChargeInvoice)
def charge(tx: Tx, cmd: ChargeInvoice, ctx: HandlerContext) -> InvoiceCharged:
    if cmd.invoice_id.startswith("refused"):
        raise StepFailed("the ledger is closed for this customer")
    effect(tx, "charge", cmd.invoice_id)
    return InvoiceCharged(charge_id=f"ch-{cmd.invoice_id}")


@ledger.handler(VoidInvoice)
def void(tx: Tx, cmd: VoidInvoice, ctx: HandlerContext) -> None:
    effect(tx, "void", cmd.invoice_id)
