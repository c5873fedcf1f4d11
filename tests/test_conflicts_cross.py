"""The facts that cross-document conflict rules compare, read from single sentences."""

import pytest
from docqa.pipelines.answer.conflicts import facts as read_facts


def facts(text):
    return {(f.kind, f.item, f.value) for f in read_facts(text)}


@pytest.mark.parametrize(
    "text, fact",
    [
        (("This Agreement shall be governed by and construed in accordance with the laws of the State "
          "of New York, without regard to its conflict of laws rules."), ("governing law", "", "new york")),
        ("This Agreement is governed by the laws of England and Wales.", ("governing law", "", "england and wales")),
        ('It is made as of March 1, 2024 (the "Effective Date") between the parties.',
         ("date", "effective date", "2024-03-01")),
        ("The Closing Date shall be 15 June 2025.", ("date", "closing date", "2025-06-15")),
        ("Customer shall pay an annual license fee of $120,000, invoiced yearly.",
         ("amount", "annual license fee", "USD 120000.00")),
        ("The License Fees are USD 50,000 per annum.", ("amount", "license fee per year", "USD 50000.00")),
        ('Buyer pays 2 million dollars (the "Transfer Price") at closing.',
         ("amount", "transfer price", "USD 2000000.00")),
        ("Either party may terminate this Agreement upon sixty (60) days' written notice.",
         ("duration", "termination notice", "60")),
        ("Supplier shall give ninety (90) days' prior written notice of any price change.",
         ("duration", "notice period", "90")),
    ],
)
def test_facts(text, fact):
    assert fact in facts(text)


@pytest.mark.parametrize(
    "text",
    [
        "Each party shall comply with the laws of any jurisdiction where it operates.",  # no place named
        "The marketing 12, 2024 plan is attached.",  # not a month
        "Licensee paid $5,000 last year.",  # an amount of nothing named
        "The report is due within 10 days after the meeting.",  # a period of no known kind
    ],
)
def test_no_fact(text):
    assert not facts(text)
