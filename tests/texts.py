"""Contract texts shared by the unit and integration tests."""

# Four clauses; with a 150-character chunk target every clause is a chunk of its own.
TEXT = (
    "1. Liability. In no event shall either party be liable for any indirect, incidental or consequential "
    "damages, and each party's aggregate liability shall not exceed the fees paid in the prior twelve months.\n\n"
    "2. Licence. Licensor grants Customer a non-exclusive, non-transferable, worldwide license to use the "
    "Software during the Term.\n\n"
    "3. Law. This Agreement shall be governed by the laws of the State of New York.\n\n"
    "4. Termination. Customer may terminate this Agreement at any time for convenience upon thirty days notice.\n"
)
LONG_TEXT = "\n\n".join(f"{i}. Section {i}. " + TEXT.replace("\n\n", " ") for i in range(1, 25))
# A clause the offline rule model scores 1.0 (unlimited + indemnify + at any time): one high-risk finding, so the
# saga opens a ticket for the document that carries it.
RISKY_CLAUSE = ("\n\n5. Indemnity. Supplier shall indemnify and hold harmless Customer, and Supplier's liability "
                "under this section shall be unlimited. Customer may terminate at any time for convenience.\n")
RISKY = TEXT + RISKY_CLAUSE
