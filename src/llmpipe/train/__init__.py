"""Backend-independent training arithmetic: LR schedule, batch layout."""
