"""`tracehouse bench ...`: one module per benchmark, each against a baseline run in the same process."""
