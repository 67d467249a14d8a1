"""The patch check: a series built on a base kernel and measured against
it on counts, over a suite's profiles, before it is merged.

  request.py   what a check is asked: the series, the base, the profiles;
               every part read and checked before anything is built
  session.py   one check: the kernels built (the base kept, each patch an
               incremental build), each profile measured on both, every
               changed path confirmed with fresh rounds and explained by
               function, and the patch that brought it found by bisection
"""
