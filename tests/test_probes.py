"""``probes.settle``: it returns only once this process's other threads are
idle (a thread burning CPU in the background, as XLA's clean-up of a large
program does: docs/planner.md, "Host memory"), at once when nothing runs,
and at its cap when something never stops."""

import threading
import time

import pytest

from cbs_jax import probes


def _burner(seconds: float, stop: threading.Event | None = None):
  """A thread that keeps one core busy for ``seconds`` (or until ``stop``)."""

  def burn():
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and not (stop and stop.is_set()):
      sum(i * i for i in range(2000))

  t = threading.Thread(target=burn, daemon=True)
  t.start()
  return t


def test_settle_waits_until_a_background_thread_has_finished():
  t0 = time.perf_counter()
  burner = _burner(0.4)
  waited = probes.settle(max_s=5.0)
  # it cannot return while the burner runs: every window it slept through
  # saw the burner's CPU time
  assert not burner.is_alive()
  assert time.perf_counter() - t0 >= 0.4
  assert waited < 5.0  # returned on its own, not at the cap


def test_settle_returns_at_once_when_nothing_runs():
  time.sleep(0.05)
  assert probes.settle(window_s=0.02) < 0.5


def test_settle_gives_up_at_its_cap():
  stop = threading.Event()
  burner = _burner(30.0, stop)
  try:
    waited = probes.settle(max_s=0.3, window_s=0.02)
  finally:
    stop.set()
    burner.join()
  assert 0.3 <= waited < 1.0


@pytest.mark.parametrize(
    "kw", [dict(max_s=0), dict(window_s=-1.0), dict(busy=float("nan")), dict(max_s=True)]
)
def test_settle_names_a_bad_argument(kw):
  with pytest.raises(ValueError, match=next(iter(kw))):
    probes.settle(**kw)
