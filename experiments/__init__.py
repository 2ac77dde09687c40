"""The papers' experiments that the data here allows: the plan (`plan`), its runner and ledger (`runner`),
and the report writer (`report`, `plots`); `python experiments/results.py` runs them."""
