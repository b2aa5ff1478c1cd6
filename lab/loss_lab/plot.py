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
    left.set_xlabel("messages")
    left.legend(loc="lower right")
    left.set_title("lost / processed twice")
    right.barh(list(y), memory, color="#2c7fb8")
    right.set_xlabel("MB per 100k messages kept")
    right.set_title("memory")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
