"""launch/report's line figures: no two cells of a panel share colour and line style, however many cells; the dev F1
by epoch marks where early-stopped seeds have dropped out of the mean."""

import numpy as np
import pytest

from launch import report
from tests.test_report import _history, _run

pytest.importorskip("matplotlib")


def _style(line):
  return line.get_color(), line.get_linestyle(), line._unscaled_dash_pattern  # pylint: disable=protected-access


def test_twelve_cells_in_one_panel_have_distinct_styles(tmp_path):
  import matplotlib.pyplot as plt

  root = str(tmp_path / "runs")
  heads = [f"h{i}" for i in range(6)]
  for head in heads:
    for rope in (True, False):
      _run(root, f"head={head},use_rope={rope},seed=0", dataset="msra", rope=rope, seed=0, head=head,
           head_kind="span", dev_history=_history([1, 2], [0.3, 0.4]), epochs=2.0)
  rows = report.collect(root)
  summary = report.summarize(rows)
  assert len(summary) == 12
  for fig in (report.plot_by_length(rows, summary), report.plot_epochs(summary)):
    try:
      (ax,) = [a for a in fig.axes if a.get_visible()]
      lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
      assert len(lines) == 12
      assert len({_style(ln) for ln in lines}) == 12
      # The legend shows them apart too (the by-length figure's legend is the figure's).
      legend = ax.get_legend() or fig.legends[0]
      assert len({_style(h) for h in legend.get_lines()}) == 12
    finally:
      plt.close(fig)


def test_epochs_mean_over_all_seeds_then_survivors_marked(tmp_path):
  """Three seeds; seed 2 stopped early after epoch 3 of 5: epochs 4-5 average two seeds only."""
  import matplotlib.pyplot as plt

  root = str(tmp_path / "runs")
  curves = {0: [0.30, 0.50, 0.60, 0.62, 0.63], 1: [0.35, 0.55, 0.65, 0.70, 0.72], 2: [0.10, 0.20, 0.25]}
  for seed, f1s in curves.items():
    _run(root, f"seed={seed}", dataset="msra", rope=True, seed=seed, dev_history=_history(range(1, len(f1s) + 1), f1s),
         epochs=float(len(f1s)), stopped_early=len(f1s) < 5)
  fig = report.plot_epochs(report.summarize(report.collect(root)))
  try:
    (ax,) = [a for a in fig.axes if a.get_visible()]
    (main,) = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    (faint,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")]
    all_seeds = [100 * np.mean([c[i] for c in curves.values()]) for i in range(3)]
    survivors = [100 * np.mean([curves[0][i], curves[1][i]]) for i in (3, 4)]
    assert list(main.get_xdata()) == [1, 2, 3, 4, 5]
    assert main.get_ydata() == pytest.approx(all_seeds + [float("nan")] * 2, nan_ok=True)
    assert faint.get_ydata()[3:] == pytest.approx(survivors) and faint.get_alpha() < 1
    assert _style(faint) == _style(main)
    assert main.get_label() == "standard, RoPE (n=3; faint from epoch 4: 2 seeds)"
    assert "still training" in fig._suptitle.get_text()  # pylint: disable=protected-access
  finally:
    plt.close(fig)
