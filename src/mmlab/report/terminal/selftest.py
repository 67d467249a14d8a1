"""`mmlab selftest`'s reports.  verdicts: the simulated operating
characteristics (judge/selftest.py) of the defaults' shape or of one
profile's, as a table per noise model, the false alarms by noise level, the
noise up to which decisions are reached, how surely order effects are named,
and whether the published goals are met.  changepoints: the release
tracker's, per simulated case (track/simulate.py)."""

from __future__ import annotations

from rich.table import Table

from mmlab.judge import selftest
from mmlab.judge.noises import NOISES, lognormal, noise
from mmlab.judge.selftest import DEFAULTS, NoiseRates, Shape, VerdictGoals
from mmlab.report.fmt import DASH, pct
from mmlab.report.terminal import console


def table(cells: list[NoiseRates], shape: Shape, experiments: int, seed: int) -> Table:
    """The operating characteristics as a rich table, one row per noise model."""
    schedule = (f"its schedule (seed {shape.seed})" if shape.seed is not None
                else "a schedule of its own each")
    out = Table(title=f"{shape.name}: {shape.describe()}; simulated: {experiments} profiles per "
                      f"cell, {schedule}, the change on one arm, seed {seed}")
    for col in selftest.header(shape.criteria.tolerance):
        out.add_column(col, justify="left" if col == "noise" else "right")
    for row in selftest.table_rows(cells):
        out.add_row(*row)
    return out


def models() -> str:
    """The noise models, one clause each: the table's legend."""
    return "noise models: " + "; ".join(f"{n.name} {n.description}" for n in NOISES)


def noise_lines(shape: Shape, experiments: int, seed: int, goals: VerdictGoals) -> list[str]:
    """The false alarms by noise level, the noise up to which the stated
    figure holds (against max_cv, the noisy flag), and up to which the
    profile reaches its decisions."""
    curve = selftest.alarms_by_noise(shape, experiments, seed)
    holds = selftest.alarm_bound(curve, goals.family_alarms)
    reach = selftest.reach(shape, experiments, seed, goals)
    twice = f"{2 * shape.criteria.tolerance:+.0%}"
    return [
        "A/A false alarms (profile) by lognormal noise per trial: "
        + ", ".join(f"{cv:.1%} {a:.1%}" for cv, a in curve),
        f"false alarms <= {goals.family_alarms:.0%} up to "
        + (f"{holds:.1%} noise per trial" if holds else "no noise level simulated")
        + f" (alpha {shape.criteria.alpha:g} bounds them at any noise); comparisons noisier "
        f"than max_cv {shape.criteria.max_cv:.0%} are flagged noisy",
        f"decisions (A/A no change >= {goals.aa_no_change:.0%}, {twice} found >= "
        f"{goals.detect:.0%}) reached up to "
        + (f"{reach:.1%} noise per trial" if reach else "no noise level simulated: "
           "more rounds are needed"),
    ]


def order_line(shape: Shape, experiments: int, seed: int) -> str:
    """How surely order effects are named, and how often without cause."""
    rates = {n: selftest.order_named(noise(n), 1.0, shape, experiments, seed)
             for n in ("FIRST", "CARRY", "LN5")}
    return (f"order effects named in A/A profiles: FIRST {rates['FIRST']:.1%}, CARRY "
            f"{rates['CARRY']:.1%}; with none there (LN5) {rates['LN5']:.1%}")


def print_report(experiments: int = 2000, seed: int = 1, shape: Shape = DEFAULTS) -> list[str]:
    """Simulate the shape, print the table, the noise levels and the
    goals; returns the goals missed (none when all are met)."""
    cells = selftest.simulate_all(shape, experiments, seed)
    out = console()
    out.print(table(cells, shape, experiments, seed))
    out.print(models())
    t = VerdictGoals()
    for line in noise_lines(shape, experiments, seed, t) + [order_line(shape, experiments, seed)]:
        out.print(line)
    missed = t.missed(cells, shape.criteria)
    verdict = "met" if not missed else "MISSED: " + "; ".join(missed)
    tol = shape.criteria.tolerance
    out.print(f"goals under {', '.join(t.held)}: false alarms (profile) <= "
              f"{t.family_alarms:.0%}, A/A no change >= {t.aa_no_change:.0%}, "
              f"{0.6 * tol:+.0%} called <= {t.inside_called:.0%}, {2 * tol:+.0%} found >= "
              f"{t.detect:.0%}, at most {t.max_rounds} rounds: {verdict}")
    return missed


def decisions(plan, experiments: int = 400) -> tuple[str, list[str]]:
    """What `experiment plan` says of a profile's verdicts, simulated with its
    shape and schedule: up to which noise per trial its rounds reach their
    decisions, and a warning when that is below its tolerance (at noise equal
    to the tolerance it then cannot decide)."""
    if not plan.tests():
        return ("verdicts: every metric is a count, judged by the count rule from 3 rounds "
                "(its trials apart and its step beyond 3 robust CVs and its floor)", [])
    shape, t = Shape.of(plan), VerdictGoals()
    tol = shape.criteria.tolerance
    reach = selftest.reach(shape, experiments, 1, t)
    what = (f"A/A 'no change' >= {t.aa_no_change:.0%} and a {2 * tol:+.0%} change found >= "
            f"{t.detect:.0%}")
    upto = f"up to {reach:.1%} noise per trial" if reach else \
        f"at no noise level simulated (from {selftest.CVS[0]:.1%} per trial)"
    info = (f"verdicts: {what} {upto} (`mmlab selftest verdicts --profile {plan.path}` "
            "gives every rate)")
    if reach is not None and reach >= tol:
        return info, []
    aa, twice = (selftest.simulate(lognormal(tol), e, shape, experiments)
                 for e in (1.0, 1 + 2 * tol))
    looks = shape.criteria.looks()
    rounds = f"{looks[0]} rounds" if len(looks) == 1 else f"{looks[0]} to {looks[-1]} rounds"
    more = ", ".join(f"{key} = {n}" for key, n, now in (("repetitions", 12, looks[0]),
                                                        ("max_repetitions", 25, looks[-1]))
                     if now < n)
    return info, [f"{plan.path}: {rounds} cannot reach a decision at {tol:.0%} noise per "
                  f"trial, its tolerance: A/A 'no change' {aa.no_change:.0%}, a {2 * tol:+.0%} "
                  f"change found {twice.called:.0%} (simulated); it decides {upto}"
                  + (f"; more rounds ({more}) decide noisier metrics" if more else "")]


def changepoint_table(rates: list) -> Table:
    """`mmlab selftest changepoints`: per simulated case, how often a
    candidate, a false change and every true step confirmed, and what the
    confirmations cost."""
    table = Table(title="release tracker, simulated 20-release series")
    for col in ("case", "series", "A/A: a candidate", "a false change", "steps all found",
                "goal", "pairs measured", "rounds each"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rates:
        aa = not r.case.steps
        table.add_row(r.case.name, str(r.series), pct(r.any_candidate) if aa else DASH,
                      pct(r.false_confirmed), DASH if aa else pct(r.found_all),
                      "<= 5%, <= 1%" if aa else (f">= {r.case.goal:.0%}" if r.case.goal
                                                 else DASH),
                      f"{r.confirmations:.2f}", f"{r.rounds:.1f}" if r.confirmations else DASH)
    return table
