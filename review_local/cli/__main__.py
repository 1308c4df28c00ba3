"""`python -m review_local.cli`: the `review` command, as the console script runs it."""

from . import main

main()
