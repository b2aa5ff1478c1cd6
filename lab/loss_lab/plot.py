"""The loss table's PNG: lost and processed-twice counts per design, and memory per 100k
messages kept (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from lab.loss_lab.report import Row


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Two horizontal bar charts side by side, written to ``path`` (PNG, 110 dpi)."""
    names = [r.design for r in rows][::-1]
    lost = [r.lost for r in rows][::-1]
    twice = [r.twice for r in rows][::-1]
    memory = [(r.memory_bytes or 0) / 1e6 for r in rows][::-1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.55 * len(rows) + 1.8), sharey=True)
    y = range(len(rows))
    left.barh([i + 0.2 for i in y], lost, height=0.4, color="#c0392b", label="lost")
    left.barh([i - 0.2 for i in y], twice, height=0.4, color="#e1a32a", label="processed twice")
    left.set_yticks(list(y), names)
    left.set_xscale("symlog", linthresh=1)  # 1 lost shows beside 1707
    left.set_xlabel("messages (symmetric log scale)")
    for i, (n_lost, n_twice) in enumerate(zip(lost, twice, strict=True)):
        left.annotate(str(n_lost), (max(n_lost, 0), i + 0.2), va="center", fontsize=7)
        left.annotate(str(n_twice), (max(n_twice, 0), i - 0.2), va="center", fontsize=7)
    left.legend(loc="lower right")
    left.set_title("lost / processed twice")
    right.barh(list(y), memory, color="#2c7fb8")
    right.set_xscale("symlog", linthresh=1)
    right.set_xlabel("MB per 100k messages kept (symmetric log scale)")
    right.set_title("memory")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
