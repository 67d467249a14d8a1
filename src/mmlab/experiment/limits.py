"""The most rounds and samples a profile or a command line may ask for.

Beyond them a plan is a typo: 100 rounds of two arms are 200 trials, three
minutes at a second a trial and hours in guests, and the profiles here use
40 at most; the paired statistics grow with the square of the rounds, so
the simulation `experiment plan` and `selftest verdicts --profile` run
takes 4 and 50 s at 100 rounds and does not finish at 1000.  10,000
samples are one mmwork process's and one stored trial's worth.  Plain
numbers, so that the command layer reads them without loading the
profile's models."""

MAX_ROUNDS = 100       # repetitions, max_repetitions, --max-repetitions
MAX_SAMPLES = 10_000   # samples_per_trial, mmlab run --samples
MAX_WARMUPS = 1000     # warmups: mmwork's own bound (workloads/core-args.c)
MAX_GUEST_STATES = 8   # guest_states: each a boot saved once per kernel, shape and cmdline
MIN_PAIRS = 6          # complete rounds from which the judge pairs them: 5 pairs
                       # cannot give p < 0.05 (the plan's warnings read it too)
