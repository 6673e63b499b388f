"""A rank that holds the interpreter lock in one native call (tests of slow-is-not-dead)."""
import itertools
import time


def hold_the_interpreter_lock(seconds: float) -> float:
    """Run one native call that keeps the interpreter lock (and a core) for at least
    ``seconds``, as a large import or a long C extension call does (builtin ``sum`` is a C
    loop that never hands the lock over); returns how long it held it. On a loaded machine
    a measured rate can be off: a hold that fell short is made again, longer."""
    count, held = 10**7, 0.0
    while held < seconds:
        start = time.perf_counter()
        sum(itertools.repeat(1, count))
        held = time.perf_counter() - start
        count = int(count * min(100.0, 1.2 * seconds / max(held, 1e-3)))
    return held
