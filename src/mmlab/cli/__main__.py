"""`python -m mmlab.cli`: the `mmlab` command without its entry point."""

from mmlab.cli import main

main()
