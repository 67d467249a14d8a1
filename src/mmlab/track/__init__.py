"""The release tracker: every Debian kernel measured on a suite of profiles,
each against one reference kernel side by side, change points found over
the release-ordered series and confirmed by mmlab's own paired verdict.

  suite.py         the suite (TOML): profiles, metrics, kernels, branches, the reference
  releases.py      the suite's series as exact releases, resolved against the catalog
  cells.py         one (profile, release) cell, measured once per package version, in
                   blocks of a profile's releases against one reference trial per round
  changepoints.py  candidates (ruptures' PELT), confirmation outcomes (emulated time's
                   too), BH over a run
  session.py       one run: cells measured, candidates confirmed, the changes
  evidence.py      what each change shows: the 0-day table, side metrics, functions
  spread.py        the cells' blocks handed to fleet machines (track run --machines)
  simulate.py      the method's operating characteristics, by simulation
  dashboard.py     what the dashboard shows: the changes counted by outcome, in order,
                   grouped by release pair (report/ renders and writes it)
"""
