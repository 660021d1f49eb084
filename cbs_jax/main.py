"""Entry point: ``python -m cbs_jax.main --config=configs/default.py --workdir=runs/x``.

Any config field can be overridden: ``--config.rl.clip_eps_high=10.0``.
"""
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from cbs_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print("summary:", {k: v for k, v in summary.items() if not isinstance(v, dict)})
  for k, v in summary.items():
    if isinstance(v, dict):
      print(f"  {k}: {v}")


if __name__ == "__main__":
  app.run(main)
