"""The checks of the exercises, one module per chapter (``exercises._checks`` gathers them)."""
