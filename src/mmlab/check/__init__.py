"""The patch check: a series built on a base kernel and measured against
it on counts, over a suite's profiles, before it is merged.

  request.py   what a check is asked: the series, the base, the profiles;
               every part read and checked before anything is built
  session.py   one check: the kernels built (the base kept, each patch an
               incremental build), each profile measured on both, every
               changed path confirmed with fresh rounds and explained by
               function, and the patch that brought it found by bisection
  changes.py   the functions the series changes, read from the base's source,
               and where the base kernel counts each
  coverage.py  which of them the check's paths ran on the base, and the
               kernels' functions compared (a change of layout alone)
  reach.py     the base counted by function per profile, kept per base
  variants.py  the table of functions each workload variant runs, and the
               command that makes it
"""
