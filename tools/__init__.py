"""Scripts for the repository itself (the documentation site), not part of the installed package."""
