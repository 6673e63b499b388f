"""What ``--scenarios`` reports besides its table: the bars the project set itself, and
worker 0's accuracy curves as a plot."""
from __future__ import annotations

from .options import SCENARIOS


def fmt(value) -> str:
    """A time in seconds, or ``n/a`` for a row that missed the target."""
    return "n/a" if value is None else f"{value:.2f}"


def bars(table):
    """The comparisons the project set itself, computed from one run's rows."""
    by = {(t["scenario"], t["row"]): t for t in table}
    lines = []

    def time_of(scenario, row):
        t = by.get((scenario, row))
        return None if t is None else t["time_to_target_s"]

    casp = time_of("classes", "CASP(sort-and-cut)")
    best = [time_of("classes", r) for r in ("BSP", "SSP(s=2)", "ASP")]
    best = min((b for b in best if b is not None), default=None)
    if casp is not None and best is not None:
        lines.append(f"classes: CASP time to target / best of BSP,SSP,ASP = {casp / best:.2f} "
                     f"(bar <= {1 / 1.3:.2f})")
    else:
        lines.append(f"classes: CASP time {casp}, best of BSP/SSP/ASP {best} (a row missed the target)")
    c, a = by.get(("classes", "CASP(sort-and-cut)")), by.get(("classes", "ASP"))
    if c and a:
        lines.append(f"classes: CASP push bytes per sample / ASP = "
                     f"{c['push_bytes_per_sample'] / a['push_bytes_per_sample']:.2f} (bar <= 0.75)")
        lines.append(f"classes: CASP communities {c['server'].get('communities')}")
    for row in ("EPSP(s=0)", "EPSP(s=2)"):
        mine = time_of("one_slow", row)
        for other in ("FlexRR-lite(s=2)", "Sync-opt(b=1)", "ConSGD", "DynSGD", "BSP"):
            theirs = time_of("one_slow", other)
            ratio = "n/a" if mine is None or theirs is None else f"{mine / theirs:.2f}"
            lines.append(f"one_slow: {row} time to target / {other} = {ratio}"
                         + (" (bar <= 0.60)" if other == "BSP" else " (bar < 1)"))
    for scenario in {t["scenario"] for t in table}:
        bsp = by.get((scenario, "BSP"))
        for row in ("CASP(sort-and-cut)", "EPSP(s=0)", "EPSP(s=2)", "FlexRR-lite(s=2)"):
            t = by.get((scenario, row))
            if bsp and t:
                lines.append(f"{scenario}: {row} final accuracy - BSP = "
                             f"{100 * (t['final_accuracy'] - bsp['final_accuracy']):+.1f} points "
                             f"(bar >= -1)")
    return lines


def plot(table, path, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted({t["scenario"] for t in table}, key=SCENARIOS.index)
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.5), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        for t in (t for t in table if t["scenario"] == scenario):
            times, accs = zip(*t["curve"])
            ax.plot(times, accs, label=t["row"], linewidth=1.2)
        ax.axhline(target, color="grey", linestyle=":")
        ax.set_title(scenario)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy (worker 0)")
        ax.set_ylim(0.5, 1.0)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)

