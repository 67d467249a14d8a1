"""This machine: external tools run through one error policy (proc), the
global mm settings with their journal and lock (knobs), the CPU clock
(cpufreq), and what the machine offers, measured now (probe).  Every later
stage may use it; it uses none."""
