"""`python -m mmlab.bench`: what `make bench` runs."""

from mmlab.bench import main

main()
