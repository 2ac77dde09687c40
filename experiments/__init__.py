"""The papers' experiments that the data here allows: the plan (`plan`), its runner (`runner`), the ledger of
finished runs (`ledger`) and what each ran on (`machine`), and the report writer (`report`, `plots`);
`python experiments/results.py` runs them."""
