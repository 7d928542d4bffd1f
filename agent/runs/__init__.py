"""`tracehouse run`: commands and matrices as runs, their process trees, spools and the host agent's presence."""
