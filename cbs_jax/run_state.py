"""``RunState``: everything an RL run carries from one round to the next.

The state is typed and explicit, and it is exactly what a checkpoint holds:

* arrays (a pytree: ``params``, ``opt_state``, ``history`` -- the behaviour
  parameters of the last ``staleness`` rounds), saved by orbax;
* ``counters`` (rounds, optimizer steps, rollouts, skipped updates, seconds,
  the base pass rate, how the run stopped);
* the noise trackers (raw gradients and Adam's metric) and the adaptive
  batch controller, which the controller reads at the next round;
* ``log``: what the end-of-run summary is computed from (every evaluation,
  the per-round timings, the split-estimator rows), so the summary never
  re-reads ``metrics.jsonl``.

``RunState`` is a JAX pytree whose leaves are the arrays; the host records
travel as its static part (``jax.tree.map`` over a state maps the arrays and
keeps the records). ``save`` / ``restore`` write and read it through a
``checkpoint.Checkpointer``: arrays as one pytree, records as JSON beside
them, with the model config that made the arrays (checked before a restore).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import controller as controller_lib
from cbs_jax import noise_tracker


@dataclasses.dataclass
class Counters:
  """Progress of a run (JSON in the checkpoint)."""

  round: int = 0  # rounds completed (the checkpoint step)
  step: int = 0  # optimizer updates, applied or skipped
  rollouts_seen: int = 0  # rollouts generated for training
  consecutive_nonfinite: int = 0  # skipped (non-finite) updates in a row
  skipped_updates: int = 0  # skipped updates in all
  seconds: float = 0.0  # wall seconds spent in rounds (all calls)
  base_pass_rate: float | None = None  # the held-out score at round 0
  stopped_at_target: bool = False  # stopped at config.train.stop_at_pass_rate
  stopped_collapsed: bool = False  # stopped below config.train.stop_below_pass_rate
  lr: float | None = None  # the learning rate of the last update
  switch_step: int | None = None  # the first update at the adaptive batch's latest N
  switch_lr_from: float | None = None  # the learning rate just before that switch

  @property
  def stopped(self) -> bool:
    return self.stopped_at_target or self.stopped_collapsed


@dataclasses.dataclass
class Evaluation:
  """One held-out evaluation: the round, the rollouts seen by then, the
  score targets are judged on and the sampled pass@1 (None where off)."""

  round: int
  rollouts: int
  score: float
  sampled: float | None = None
  expected: bool = False  # the score is the exact expected pass rate


@dataclasses.dataclass
class RunLog:
  """What the end-of-run summary reads, one entry per round or evaluation."""

  evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
  gen_seconds: float = 0.0
  update_seconds: float = 0.0
  calibration_seconds: float = 0.0  # the adaptive controller's round-time calibration
  # the split estimator's per-round (trace_intra, trace_inter, g2), rounds
  # where g2 was not a number left out
  split: list[dict[str, float]] = dataclasses.field(default_factory=list)

  def add_split(self, trace_intra: float, trace_inter: float, g2: float) -> None:
    if not math.isnan(g2):
      self.split.append(dict(trace_intra=trace_intra, trace_inter=trace_inter, g2=g2))

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict) -> RunLog:
    return cls(
        evaluations=[Evaluation(**e) for e in d["evaluations"]],
        gen_seconds=d["gen_seconds"],
        update_seconds=d["update_seconds"],
        calibration_seconds=d.get("calibration_seconds", 0.0),
        split=list(d["split"]),
    )


@dataclasses.dataclass
class RunState:
  """The state of an RL run between rounds (see the module docstring)."""

  params: Any
  opt_state: Any
  history: list
  counters: Counters
  noise: noise_tracker.NoiseEMA  # tracker of raw gradients (what every signal reads)
  noise_adam: noise_tracker.NoiseEMA  # the same in Adam's preconditioned metric
  controller: controller_lib.AdaptiveBatch | None
  log: RunLog

  def arrays(self) -> dict:
    """The array part, as the pytree orbax saves."""
    return dict(params=self.params, opt_state=self.opt_state, history=self.history)

  def records(self) -> dict:
    """The host part, as JSON."""
    return dict(
        counters=dataclasses.asdict(self.counters),
        noise=self.noise.state_dict(),
        noise_adam=self.noise_adam.state_dict(),
        controller=None if self.controller is None else self.controller.state_dict(),
        log=self.log.to_json(),
    )


jax.tree_util.register_dataclass(
    RunState,
    data_fields=["params", "opt_state", "history"],
    meta_fields=["counters", "noise", "noise_adam", "controller", "log"],
)


def save(ckpt: ckpt_lib.Checkpointer, state: RunState, model_config: dict) -> None:
  """Checkpoint ``state`` at step ``state.counters.round``."""
  ckpt.save(state.counters.round, state.arrays(), dict(state.records(), model=model_config))


def restore(ckpt: ckpt_lib.Checkpointer, step: int, like: RunState) -> RunState:
  """The state saved at ``step``, its arrays shaped (and sharded) like
  ``like``'s; ``like`` supplies fresh trackers and controller that the saved
  records are loaded into (a controller whose buckets differ from the
  saved ones is an error naming the config fields)."""
  arrays, rec = ckpt.restore(step, like.arrays())
  if "counters" not in rec:
    raise ckpt_lib.CheckpointError(
        f"checkpoint {ckpt.directory}/{step} was written before the typed run state "
        "(no 'counters' record): resume it with the cbs_jax version that wrote it, or "
        "start the run in a new workdir"
    )
  like.noise.load_state_dict(rec["noise"])
  like.noise_adam.load_state_dict(rec["noise_adam"])
  if like.controller is not None and rec["controller"] is not None:
    like.controller.load_state_dict(rec["controller"])
  return RunState(
      params=arrays["params"],
      opt_state=arrays["opt_state"],
      history=arrays["history"],
      counters=Counters(**rec["counters"]),
      noise=like.noise,
      noise_adam=like.noise_adam,
      controller=like.controller,
      log=RunLog.from_json(rec["log"]),
  )
