"""The release tracker: every Debian kernel measured on a suite of profiles,
each against one reference kernel side by side, change points found over
the release-ordered series and confirmed by mmlab's own paired verdict.

  suite.py         the suite (TOML): profiles, metrics, kernels, the reference
  cells.py         one (profile, kernel) cell: measured once per package version
  changepoints.py  candidates (ruptures) and their confirmation
  simulate.py      the method's operating characteristics, by simulation
  dashboard.py     the static dashboard, its Atom feed, text and JSON
"""
