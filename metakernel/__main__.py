"""`python3 -m metakernel` (the H200 machine runs the checkout without a console script)."""

from metakernel.cli import main

main()
