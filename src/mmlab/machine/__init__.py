"""This machine: external tools run through one error policy (proc), the
global mm settings with their journal and lock (knobs), the CPU clock
(cpufreq), where caches live (paths), and a memory cgroup of its own for
each host trial (memcg).  Every later stage may use it; it uses none."""
