"""CPU accounting for the benchmarks' foreign-load guard: busy CPU seconds of the whole machine (/proc/stat),
of this process and its reaped children, and of a server's process session (/proc/<pid>/stat). What the
machine spent beyond ours and the measured server's is load from other processes, which disturbs timings
on these shared cores."""

from __future__ import annotations

import os
import resource


def busy_seconds() -> float:
    """CPU seconds all processes have spent busy since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process."""
    t = os.times()
    return t.user + t.system


def children_seconds() -> float:
    """CPU seconds of this process's children that have been waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def foreign_load(busy: float, own: float, server: float, wall: float, ncpu: int) -> float:
    """Share of the machine other processes used: (busy - ours - the server's) / (wall x cores)."""
    if wall <= 0:
        return 0.0
    return max(0.0, busy - own - server) / (wall * ncpu)


def parse_proc_stat(text: str) -> tuple[int, float]:
    """(session id, CPU ticks of the process and its reaped children) from a /proc/<pid>/stat line."""
    rest = text[text.rindex(")") + 2 :].split()  # rest[0] is field 3 (state)
    return int(rest[3]), float(sum(int(x) for x in rest[11:15]))


def _session_stats(sid: int) -> list[tuple[int, float]]:
    """(pid, CPU ticks) of every live process in session ``sid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                s, ticks = parse_proc_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue
        if s == sid:
            found.append((int(entry.name), ticks))
    return found


def session_cpu_seconds(sid: int) -> float:
    """CPU seconds of every live process in session ``sid`` (with the children they have reaped)."""
    return sum(ticks for _, ticks in _session_stats(sid)) / os.sysconf("SC_CLK_TCK")


def session_pids(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    return [pid for pid, _ in _session_stats(sid)]
