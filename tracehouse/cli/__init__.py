"""The composition root: the `tracehouse` command, one module per command group, and the server wiring.

Nothing here is imported by the parts it wires (agent/, store/, ingest/, query/, ui/) or by the kernel."""
