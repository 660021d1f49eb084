"""Entry point: ``python -m cbs_jax.main --config=configs/default.py --workdir=runs/x``.

Any config field can be overridden: ``--config.rl.clip_eps_high=10.0``.

Before training starts, process 0 records the run in its workdir:

* ``config.json``: the run's full config (file + overrides), in the format
  ``cbs_jax.sweep`` writes, so ``cbs_jax.plan --run_dir`` and other tools read
  the run's model and task from the workdir. Every start rewrites it: it is
  the config the run continues under.
* ``provenance.json``: where the run came from, written by its first start:
  ``report.provenance()`` (git commit and dirty flag, package versions,
  platform, devices) with the command line and ``started_utc``. A later start
  in the same workdir (a resume) keeps all of that and appends one entry to
  ``restarts``: its own time, command and ``report.provenance()``, and the
  config fields it changed (``{"train.num_rounds": [old, new]}``).
"""

from __future__ import annotations

import datetime
import json
import sys

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

from cbs_jax import config as config_lib
from cbs_jax import host_memory
from cbs_jax import paths
from cbs_jax import report
from cbs_jax import sharding
from cbs_jax import train

CONFIG_JSON = "config.json"
PROVENANCE_JSON = "provenance.json"


def config_json(config: ml_collections.ConfigDict) -> str:
  """``config`` as the text of a ``config.json`` (what ``cbs_jax.sweep`` writes)."""
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v:
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_changes(before: dict, after: dict) -> dict:
  """{dotted field: [before, after]} for the fields that differ between two
  JSON config dicts (a field absent on one side is None there)."""
  fb, fa = _flat(before), _flat(after)
  return {k: [fb.get(k), fa.get(k)] for k in sorted(set(fb) | set(fa)) if fb.get(k) != fa.get(k)}


def _read_json(path: str):
  try:
    return json.loads(paths.read_text(path))
  except (OSError, ValueError) as e:
    raise ValueError(
        f"{path} is unreadable ({e}); move it away to start the run's " "record afresh"
    ) from None


def record_start(
    config: ml_collections.ConfigDict, workdir: str, command: str | None = None
) -> dict:
  """Write ``config.json`` and ``provenance.json`` into ``workdir`` for a
  start of the run (first start or resume; see the module docstring).
  ``command`` defaults to this process's command line. Returns the
  provenance record as written."""
  paths.makedirs(workdir)
  command = report.command_line() if command is None else command
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  prov_path = paths.join(workdir, PROVENANCE_JSON)
  cfg_path = paths.join(workdir, CONFIG_JSON)
  new_config = json.loads(config_json(config))
  if paths.exists(prov_path):
    record = _read_json(prov_path)
    before = _read_json(cfg_path) if paths.exists(cfg_path) else {}
    record.setdefault("restarts", []).append(
        dict(
            started_utc=now,
            command=command,
            **report.provenance(),
            config_changes=config_changes(before, new_config),
        )
    )
  else:
    record = dict(started_utc=now, command=command, **report.provenance(), restarts=[])
  paths.write_atomic(cfg_path, config_json(config))
  paths.write_atomic(prov_path, json.dumps(record, indent=2, default=str))
  return record


def run(config: ml_collections.ConfigDict, workdir: str, command: str | None = None) -> dict:
  """Validate ``config``, record the start in ``workdir`` (process 0 only;
  ``record_start``), then train (or resume); returns the end-of-run summary."""
  config_lib.validate(config)
  if config.distributed.enabled:  # before anything touches a device (a no-op in train)
    sharding.initialize_distributed(config.distributed)
  if jax.process_index() == 0:
    record_start(config, workdir, command)
  return train.train_and_evaluate(config, workdir)


def _define_flags():
  config_flags.DEFINE_config_file("config", None, "Config file (get_config).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  c = flags.FLAGS.config
  hint = host_memory.hugepage_hint(
      c.batch.num_prompts * c.batch.rollouts_per_prompt, jax.default_backend()
  )
  if hint:
    print(hint, file=sys.stderr)
  summary = run(c, flags.FLAGS.workdir)
  print("summary:", {k: v for k, v in summary.items() if not isinstance(v, dict)})
  for k, v in summary.items():
    if isinstance(v, dict):
      print(f"  {k}: {v}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
