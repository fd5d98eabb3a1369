"""Draw docs/scale-parked.png from results/sim/results.json, or from several results files
(``--results a.json b.json``: runs made apart, drawn together). Needs matplotlib: the
``bench`` extra; ``make simulate`` runs it with the bench install."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

try:
    import matplotlib
except ImportError:
    raise SystemExit(
        "bench.sim.plot draws with matplotlib, the bench extra: make simulate installs it "
        "(pip install -e '.[bench]')"
    ) from None

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TOTAL_LIMIT = 100_000  # bench/sim/brokers.py; not imported, so this runs without the proxy

STYLE = {
    "notify": ("tab:blue", "-"),
    "coupled": ("tab:orange", "-"),
    "adaptive": ("tab:green", ":"),
    "notify+cap": ("tab:red", "--"),
    "notify+shared": ("tab:purple", "-."),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", nargs="+", default=["results/sim/results.json"])
    ap.add_argument("--out", default="docs/scale-parked.png")
    args = ap.parse_args()
    rows = [
        r
        for path in args.results
        for r in json.loads(Path(path).read_text())
        if r["scenario"]["case"] == "grid"
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[tuple[str, int], list] = {}
    for r in rows:
        s = r["scenario"]
        series.setdefault((s["variant"], s["proxies"]), []).append(r)
    markers = "os^Dv"
    proxies = sorted({p for _, p in series})
    for (variant, p), rs in sorted(series.items()):
        rs.sort(key=lambda r: r["scenario"]["keys"])
        x = [r["scenario"]["proxies"] * r["scenario"]["keys"] for r in rs]
        parked = [r["parked_notifications_mean"] + r["parked_pops_mean"] for r in rs]
        full = [max(r["polling_full_per_s"], 0.1) for r in rs]
        color, ls = STYLE.get(variant, ("gray", "-"))
        m = markers[proxies.index(p) % len(markers)]
        label = f"{variant}, P={p}"
        ax1.plot(x, parked, ls, color=color, marker=m, label=label, alpha=0.85)
        ax2.plot(x, full, ls, color=color, marker=m, label=label, alpha=0.85)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("P x K (proxies x active keys)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.axhline(TOTAL_LIMIT, color="black", lw=1.5)
    at_left = ax1.get_yaxis_transform()  # x in axes fraction, y in data
    ax1.text(0.02, TOTAL_LIMIT * 1.15, "broker limit: 100,000 parked (per table)", fontsize=8,
             transform=at_left)  # fmt: skip
    ax1.axhline(1_024, color="gray", lw=1, ls="--")
    ax1.text(0.02, 1_024 * 1.15, "1,024: limit per key (topic@group@queue)", fontsize=8,
             transform=at_left)  # fmt: skip
    ax1.set_ylabel("parked requests per broker (notifications + pops), mean")
    ax1.set_title("Parked requests per broker (B=50, C=100 per key)")
    ax2.set_ylabel("POLLING_FULL answers per second per broker (0 drawn at 0.1)")
    ax2.set_title("Refused parking (POLLING_FULL)")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
