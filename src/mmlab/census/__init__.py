"""The census: how many VMAs share one anon_vma in real programs.

Seed 004's patch shortens rmap_walk_ksm, whose cost grows with the VMAs on
one anon_vma's interval tree; seed 002 asks how many real programs have.
The census counts them from the kernel's own structures (iterator.py), by
root anon_vma (groups.py), with the pattern that split them (pattern.py), for
given PIDs or every process (take.py), a command sampled while it runs
(command.py) or a recipe of a real program (recipe.py); report/terminal/census.py
prints it.
See docs/census.md.
"""
