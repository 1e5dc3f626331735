"""`python -m draftsmith ...` is the same as the `draftsmith` command."""

from draftsmith.cli import main

main()
