"""Profiles (TOML) -> arms -> a seeded, interleaved schedule of trials.

A profile names a workload, its base parameters, and either a matrix of axes
(the arms are their cartesian product) or an explicit list of arms (an A/A
check is the same arm twice under two names).  An axis is a workload
parameter or a host setting (`thp_mode`, `thp_defrag`, `swap`, `cpus`,
`damon`, `governor`, `turbo`, `ksm.<knob>`, `sysctl.<name>`).  The schedule
runs every arm once per round, in an order shuffled by the seed, so slow
drift of a noisy machine spreads over all arms instead of biasing one.

  profile.py   the pydantic models a profile is validated into; error locations
  plan.py      Arm and Plan: load, parse, expand, baselines, derived plans
  schedule.py  the seeded, interleaved order of trials
  single.py    `mmlab run`'s plan: one arm, written as a profile
  source.py    a profile's text, read before anything heavy is imported
"""
