"""The full configuration tree, its defaults, and its validation.

Every config file in ``configs/`` starts from ``base_config()`` and changes a
few fields, so each field is defined and commented once, here. The returned
ConfigDict is locked: a mistyped field (``--config.rl.clip_eps=...``) is an
error from ml_collections that names it, and overrides are type-checked.
``validate`` checks ranges and consistency before anything compiles and
raises ``ValueError`` naming the field and the bad value; the fields of
``config.rl`` and ``config.sampling`` are checked by building their specs
(``rl.RLSpec``, ``scoring.SamplingSpec``), which hold those checks.
"""

from __future__ import annotations

import math

import ml_collections

from cbs_jax import controller
from cbs_jax import gradstats
from cbs_jax import lr_rules
from cbs_jax import model as model_lib
from cbs_jax import rl
from cbs_jax import scoring
from cbs_jax import sharding
from cbs_jax import systems
from cbs_jax import tasks

ConfigDict = ml_collections.ConfigDict


def base_config() -> ConfigDict:
  c = ConfigDict()
  c.mode = "rl"  # "rl": GRPO/PPO from the SFT base; "sft": supervised warm start only
  c.seed = 0  # seeds parameters, prompts, sampling: same seed, same run
  c.hf_checkpoint = ""  # Hugging Face checkpoint dir (config.json, *.safetensors,
  # tokenizer.json) to start RL from instead of an SFT base: its
  # tokenizer, its weights; config.model must match it ("" = off)

  c.task = ConfigDict()
  c.task.name = "arithmetic"  # arithmetic | countdown | gsm8k
  c.task.kwargs = ConfigDict()  # passed to the task constructor (see cbs_jax/tasks)
  c.task.kwargs.min_digits = 1  # arithmetic: fewest digits in an operand
  c.task.kwargs.max_digits = 3  # arithmetic: most digits in an operand
  c.task.kwargs.ops = "+-"  # arithmetic: operators drawn uniformly
  c.task.kwargs.mul_max_digits = 2  # arithmetic: digit cap for '*' operands

  c.model = model_lib.default_config()  # see model.default_config for each field

  c.sampling = ConfigDict()
  c.sampling.temperature = 1.0  # rollout temperature (behaviour log-probs use it)
  c.sampling.top_k = 0  # 0 = off
  c.sampling.top_p = 1.0  # 1.0 = off
  c.sampling.max_new_tokens = 0  # 0 = the task's longest solution + 1 (for EOS)
  c.sampling.suppress_special = True  # never sample PAD/BOS inside a completion (the decoder
  # would skip them): the completion's support is the
  # task's alphabet plus EOS, as the exact eval assumes
  # (train.prepare puts their ids in setup.sampling)

  c.sft = ConfigDict()
  c.sft.steps = 300  # optimizer steps of next-token training on solutions
  c.sft.batch_size = 64  # problems per SFT step
  c.sft.lr = 3e-3  # Adam peak learning rate (cosine decay to 10%)
  c.sft.warmup_steps = 20  # linear warmup steps
  c.sft.label_noise = 0.0  # fraction of SFT targets with one character replaced at random
  c.sft.eval_every = 100  # steps between held-out pass-rate evaluations (0 = end only)
  c.sft.stop_at_pass_rate = 0.0  # end the base at the first evaluation at or above this
  # (0 = off): bases matched in held-out pass rate across tasks and formats
  c.sft.base_dir = "sft_base"  # RL: SFT base checkpoint dir, relative to the workdir
  # (absolute paths allowed); built here if missing

  c.rl = ConfigDict()
  c.rl.algo = "grpo"  # grpo (group advantages) | ppo (value head + GAE)
  c.rl.advantage = "grpo"  # grpo | drgrpo | rloo | batch_std | gae (ppo's: GAE + whitening)
  c.rl.adv_eps = 1e-6  # epsilon added to the std in grpo / batch_std
  c.rl.adv_std_ddof = 0  # grpo / batch_std std: 0 = population (cbs_jax); TRL, verl and
  # Tunix use 1, i.e. advantages sqrt((K-1)/K) times ours
  c.rl.adv_whiten = True  # gae: whiten advantages over the batch's tokens (couples rollouts)
  c.rl.loss = "ppo"  # ppo (clipped) | cispo | pg | gspo
  c.rl.clip_eps_low = 0.2  # lower clip: ratio >= 1 - clip_eps_low (>= 1: no lower clip)
  c.rl.clip_eps_high = 0.2  # upper clip: ratio <= 1 + clip_eps_high (10.0 ~ unclipped)
  c.rl.clip_c = 0.0  # dual-clip constant (> 1), 0 = off
  c.rl.aggregation = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm
  c.rl.kl_beta = 0.0  # weight of the KL penalty to the frozen start policy
  c.rl.kl_estimator = "k3"  # k1 | k2 | k3 (Schulman's estimators, see rl.kl_penalty)
  c.rl.gamma = 1.0  # ppo: discount
  c.rl.lam = 0.95  # ppo: GAE lambda
  c.rl.vf_coef = 0.5  # ppo: value-loss weight
  c.rl.value_clip = 0.0  # ppo: value clipping range, 0 = off

  c.batch = ConfigDict()
  c.batch.num_prompts = 16  # P prompts per generation round
  c.batch.rollouts_per_prompt = 16  # K rollouts per prompt (N = P*K)
  c.batch.num_minibatches = 1  # optimizer steps per epoch over the round (splits prompts)
  c.batch.num_epochs = 1  # passes over the round; updates/round = minibatches*epochs
  c.batch.schedule = "fixed"  # fixed | adaptive (prompts per round set from the noise tracker)
  c.batch.adaptive_min_prompts = 8  # adaptive: smallest P (buckets: min * 2^j, bounds recompiles)
  c.batch.adaptive_max_prompts = 256  # adaptive: largest P
  c.batch.adaptive_factor = 1.0  # adaptive: target N = factor * signal (rollouts)
  c.batch.adaptive_every = 10  # adaptive: rounds between decisions
  c.batch.adaptive_signal = "b_noise"  # adaptive: b_noise (raw gradients) | b_noise_adam (in
  # Adam's preconditioned metric) | b_crit (the raw
  # tracker x adaptive_b_crit_ratio; see cbs_jax/controller.py)
  c.batch.adaptive_b_crit_ratio = 0.0  # adaptive, signal b_crit: B_crit / B_noise measured by an
  # on-policy study at this K (0 = unset)
  c.batch.adaptive_hysteresis = 1.25  # adaptive: move only when the whole interval leaves the
  # current bucket's range widened by this factor
  c.batch.adaptive_z = 2.0  # adaptive: tracker interval = estimate +- z SE
  c.batch.adaptive_objective = "time"  # adaptive: time (the bucket with the least predicted
  # time to a target, cbs_jax/time_optimal.py) | steps (N = factor * signal)
  c.batch.adaptive_round_time = "measured"  # adaptive, objective time: seconds per round
  # measured on this machine, or an accelerator of cbs_jax/systems.py (e.g. h100_sxm: a
  # modelled run, its roofline's round times)
  c.batch.adaptive_calibrate = True  # adaptive, measured: when the signal first resolves with
  # one batch size timed, time a round at the next bucket (two points for the throughput fit)
  c.batch.adaptive_switch_warmup = 5  # adaptive: updates over which the lr moves from the
  # old batch's to the new batch's rate after a switch (0: jump)
  c.batch.adaptive_rescale_nu = True  # adaptive: rescale Adam's second moment for the new
  # batch on a switch (cbs_jax/batch_switch.py)
  c.batch.adaptive_rescale_mu = True  # adaptive: and the first moment's noise with it
  # (by the square root of nu's factor: the step right after a switch equals the one before)
  c.batch.staleness = 0  # rounds the behaviour policy lags (async-style generation)

  c.optim = ConfigDict()
  c.optim.lr = 3e-4  # Adam learning rate at the reference batch size
  c.optim.lr_rule = "sqrt"  # constant | sqrt | linear: lr = lr * rule(N / ref_batch)
  c.optim.ref_batch = 256  # reference rollouts per update for lr_rule
  c.optim.warmup_steps = 5  # linear warmup (optimizer steps)
  c.optim.b1 = 0.9  # Adam beta1
  c.optim.b2 = 0.99  # Adam beta2
  c.optim.eps = 1e-8  # Adam epsilon
  c.optim.weight_decay = 0.0  # decoupled weight decay
  c.optim.grad_clip = 1.0  # global-norm clip, 0 = off

  c.train = ConfigDict()
  c.train.num_rounds = 60  # generation rounds
  c.train.eval_every = 10  # rounds between evaluations (0 = start and end only)
  c.train.eval_prompts = 512  # held-out prompts for pass@1
  c.train.eval_seed = 12345  # seed of the held-out prompt set
  c.train.eval_temperature = 1.0  # pass@1 sampling temperature
  c.train.eval_expected = True  # also the exact expected pass rate by teacher forcing (tasks
  # that enumerate their answers; no sampling noise)
  c.train.eval_sampled = True  # the sampled pass@1 (SE ~0.02 at 512 prompts)
  c.train.stop_at_pass_rate = 0.0  # stop once the eval pass rate reaches this (0 = off; sweeps to
  # a target): eval_expected_pass where computed, else sampled
  c.train.stop_below_pass_rate = 0.0  # stop once the eval pass rate falls below this (0 = off):
  # a sweep's diverged runs end early, marked stopped_collapsed
  c.train.checkpoint_every = 10  # rounds between checkpoints (the last round always saved)
  c.train.max_consecutive_nonfinite = 3  # stop after this many skipped updates in a row
  c.train.progress = True  # console progress bar

  c.mesh = ConfigDict()  # (data, fsdp, tensor) mesh over all devices of all processes
  c.mesh.data = -1  # devices splitting rollouts, params replicated; -1 = what the others leave
  c.mesh.fsdp = 1  # devices splitting rollouts AND sharding params / optimizer state
  c.mesh.tensor = 1  # devices splitting heads / MLP / vocabulary (tensor parallel)
  # logical parameter axis -> mesh axis ('' = replicated), as "name=axis,..." (sharding.py)
  c.mesh.rules = sharding.format_rules(sharding.DEFAULT_RULES)

  c.distributed = ConfigDict()  # multi-process (multi-host) runs through jax.distributed
  c.distributed.enabled = False  # call jax.distributed.initialize() before anything else;
  # on TPU VMs / SLURM / Open MPI the fields below may stay
  # empty (JAX detects them); set them elsewhere
  c.distributed.coordinator_address = ""  # "host:port" of process 0 ("" = auto-detect)
  c.distributed.num_processes = 0  # 0 = auto-detect
  c.distributed.process_id = -1  # -1 = auto-detect
  c.distributed.local_device_ids = ""  # "0,1,..." devices of this process ("" = all)
  c.distributed.initialization_timeout = 300  # seconds to wait for every process
  c.distributed.heartbeat_timeout = 100  # seconds of silence before a process counts as dead
  # (the others then stop: restart the job to resume)

  c.drift = ConfigDict()
  c.drift.probe_prompts = 0  # prompts per round sampled from the behaviour policy and never
  # trained on: drift (exact full-vocabulary KL, k1/k3, clip
  # fractions, ESS) is measured on them before every update, on
  # tokens the current parameters were not fitted to (0 = off)

  c.noise = ConfigDict()
  c.noise.split_every = 1  # rounds between split-microbatch estimates (0 = off)
  c.noise.exact_every = 0  # rounds between exact per-rollout estimates (0 = off)
  c.noise.chunk_prompts = 4  # exact path: prompts per vmap chunk (divides the prompts of an update)
  c.noise.exact_method = "vmap"  # exact path: "vmap" (per-rollout grads, chunked) or "ghost"
  # (one forward + backward, Gram sums; gradstats.group_moments)
  c.noise.ema_decay = 0.99  # tracker EMA decay (numerators, denominators separately); G2 needs
  # ~25k pooled rollouts to resolve, so ~1/(1-decay) rounds of N must reach that
  c.noise.drift_every = (
      0  # off-policy: per-rollout trace_intra at every reuse step, every n rounds (0 = off)
  )
  c.lock()  # a mistyped field is an error; use `with c.unlocked():` to add one
  return c


# choices come from the registries they select from, so they cannot drift
# (config.rl's and config.sampling's fields: rl.RLSpec, scoring.SamplingSpec)
_CHOICES = {
    "mode": ("rl", "sft"),
    "optim.lr_rule": lr_rules.LR_RULES,
    "batch.schedule": ("fixed", "adaptive"),
    "batch.adaptive_signal": controller.SIGNALS,
    "batch.adaptive_objective": controller.OBJECTIVES,
    "noise.exact_method": gradstats.EXACT_METHODS,
}
_POSITIVE = (
    "sft.steps",
    "sft.batch_size",
    "batch.num_prompts",
    "batch.rollouts_per_prompt",
    "batch.num_minibatches",
    "batch.num_epochs",
    "optim.ref_batch",
    "train.num_rounds",
    "train.eval_prompts",
    "train.max_consecutive_nonfinite",
    "noise.chunk_prompts",
    "batch.adaptive_min_prompts",
    "batch.adaptive_max_prompts",
    "batch.adaptive_factor",
    "batch.adaptive_every",
    "batch.adaptive_z",
)
_NON_NEGATIVE = (
    "seed",
    "drift.probe_prompts",
    "sampling.max_new_tokens",
    "sft.warmup_steps",
    "sft.eval_every",
    "batch.staleness",
    "optim.warmup_steps",
    "optim.weight_decay",
    "optim.grad_clip",
    "train.eval_every",
    "train.checkpoint_every",
    "noise.split_every",
    "noise.exact_every",
    "noise.drift_every",
    "batch.adaptive_b_crit_ratio",
    "batch.adaptive_switch_warmup",
)


def parent_and_leaf(config: ConfigDict, dotted: str) -> tuple[ConfigDict, str]:
  """The ConfigDict holding field ``dotted`` (e.g. "batch.num_prompts") and
  the field's own key; ValueError naming ``dotted`` and the fields known where
  the path breaks when ``config`` has no such field."""
  parts = dotted.split(".")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ConfigDict) or part not in node:
      where = ".".join(parts[:i]) or "the config root"
      known = sorted(node.keys()) if isinstance(node, ConfigDict) else []
      raise ValueError(
          f"unknown config field {dotted!r} ({part!r} is not a field of "
          f"{where}; known: {known})"
      )
    if i < len(parts) - 1:
      node = node[part]
  return node, parts[-1]


def get_path(config: ConfigDict, dotted: str):
  """The value of field ``dotted`` (e.g. "batch.num_prompts") of ``config``;
  ValueError naming ``dotted`` when there is no such field."""
  node, leaf = parent_and_leaf(config, dotted)
  return node[leaf]


def _num(c, dotted):
  """The numeric value of a field; None or a non-number is an error naming it."""
  v = get_path(c, dotted)
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise ValueError(f"config.{dotted} must be a number, got {v!r}")
  return v


def validate(c: ConfigDict) -> None:
  """Raise ValueError naming the first bad field; returns None when all is well."""
  if c.task.name not in tasks.TASKS:
    raise ValueError(f"config.task.name={c.task.name!r} is not one of {sorted(tasks.TASKS)}")
  for field, choices in _CHOICES.items():
    v = get_path(c, field)
    if v not in choices:
      raise ValueError(f"config.{field}={v!r} is not one of {list(choices)}")
  # config.rl and config.sampling: their specs check every field on construction
  rl.RLSpec.from_config(c.rl)
  scoring.SamplingSpec.from_config(c.sampling)
  for field in _POSITIVE:
    v = _num(c, field)
    if isinstance(v, bool) or not v > 0:
      raise ValueError(f"config.{field} must be > 0, got {v!r}")
  for field in _NON_NEGATIVE:
    v = _num(c, field)
    if isinstance(v, bool) or not v >= 0:
      raise ValueError(f"config.{field} must be >= 0, got {v!r}")
  for field in ("optim.lr", "sft.lr", "train.eval_temperature", "optim.eps"):
    v = _num(c, field)
    if not v > 0:
      raise ValueError(f"config.{field} must be > 0, got {v!r}")
  for field in ("optim.lr", "sft.lr"):
    if not math.isfinite(get_path(c, field)):
      raise ValueError(f"config.{field} must be finite, got {get_path(c, field)!r}")
  for field in ("train.stop_at_pass_rate", "train.stop_below_pass_rate", "sft.stop_at_pass_rate"):
    if not 0.0 <= _num(c, field) <= 1.0:
      raise ValueError(f"config.{field} must be in [0, 1], got {get_path(c, field)!r}")
  for field in ("optim.b1", "optim.b2", "sft.label_noise"):
    v = _num(c, field)
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"config.{field} must be in [0, 1], got {v!r}")
  if not 0.0 <= _num(c, "noise.ema_decay") < 1.0:
    raise ValueError(f"config.noise.ema_decay must be in [0, 1), got {c.noise.ema_decay!r}")
  sizes = [_num(c, f"mesh.{a}") for a in sharding.MESH_AXES]
  for a, v in zip(sharding.MESH_AXES, sizes):
    if not isinstance(v, int) or not (v == -1 or v > 0):
      raise ValueError(
          f"config.mesh.{a} must be a positive integer or -1 (the rest), " f"got {v!r}"
      )
  if sizes.count(-1) > 1:
    raise ValueError(
        f"config.mesh: at most one of data, fsdp, tensor may be -1, got "
        f"{dict(zip(sharding.MESH_AXES, sizes))}"
    )
  d = c.distributed
  if not isinstance(d.enabled, bool):
    raise ValueError(f"config.distributed.enabled must be True or False, got {d.enabled!r}")
  if d.enabled:
    if _num(c, "distributed.num_processes") < 0:
      raise ValueError(
          f"config.distributed.num_processes must be >= 0 (0 = auto), got " f"{d.num_processes!r}"
      )
    if _num(c, "distributed.process_id") < -1 or (
        d.num_processes and d.process_id >= d.num_processes
    ):
      raise ValueError(
          f"config.distributed.process_id={d.process_id!r} must be -1 (auto) or "
          f"in [0, config.distributed.num_processes={d.num_processes})"
      )
    for f in ("initialization_timeout", "heartbeat_timeout"):
      if not _num(c, f"distributed.{f}") > 0:
        raise ValueError(f"config.distributed.{f} must be > 0, got {d[f]!r}")
    ids = str(d.local_device_ids).split(",") if d.local_device_ids else []
    if not all(i.strip().isdigit() for i in ids):
      raise ValueError(
          f"config.distributed.local_device_ids={d.local_device_ids!r} must be "
          "'' or comma-separated device ids"
      )
    if d.coordinator_address and ":" not in d.coordinator_address:
      raise ValueError(
          f"config.distributed.coordinator_address={d.coordinator_address!r} " "must be 'host:port'"
      )
  model_lib.validate_config(c.model, prefix="config.model")
  P, K = c.batch.num_prompts, c.batch.rollouts_per_prompt
  if c.mode == "rl":
    if c.rl.algo == "grpo" and K < 2:
      raise ValueError(
          f"config.batch.rollouts_per_prompt={K}: GRPO needs K >= 2 "
          "rollouts per prompt for a group baseline"
      )
    if P % c.batch.num_minibatches:
      raise ValueError(
          f"config.batch.num_minibatches={c.batch.num_minibatches} does not divide "
          f"config.batch.num_prompts={P} (minibatches split the round by prompt, "
          f"so N=P*K={P * K} rollouts cannot be split evenly)"
      )
    P_mb = P // c.batch.num_minibatches
    if c.noise.split_every and (P_mb % 2 or K % 2):
      raise ValueError(
          f"config.noise.split_every={c.noise.split_every} needs an even number of "
          f"prompts per update ({P_mb}) and even config.batch.rollouts_per_prompt "
          f"({K}); set config.noise.split_every=0 or change the batch"
      )
    if (c.noise.exact_every or c.noise.drift_every) and P_mb % c.noise.chunk_prompts:
      raise ValueError(
          f"config.noise.chunk_prompts={c.noise.chunk_prompts} does not divide the "
          f"{P_mb} prompts of one update"
      )
    if c.batch.schedule == "adaptive":
      b = c.batch
      if not _num(c, "batch.adaptive_hysteresis") >= 1.0:
        raise ValueError(
            f"config.batch.adaptive_hysteresis must be >= 1, got " f"{b.adaptive_hysteresis!r}"
        )
      for field in ("batch.adaptive_factor", "batch.adaptive_z", "batch.adaptive_hysteresis"):
        if not math.isfinite(_num(c, field)):
          raise ValueError(f"config.{field} must be finite, got {get_path(c, field)!r}")
      if b.adaptive_max_prompts < b.adaptive_min_prompts:
        raise ValueError(
            f"config.batch.adaptive_max_prompts={b.adaptive_max_prompts} is "
            f"below config.batch.adaptive_min_prompts={b.adaptive_min_prompts}"
        )
      unit = (
          b.num_minibatches
          * (2 if c.noise.split_every else 1)
          * (c.noise.chunk_prompts if (c.noise.exact_every or c.noise.drift_every) else 1)
      )
      if b.adaptive_min_prompts % unit:
        raise ValueError(
            f"config.batch.adaptive_min_prompts={b.adaptive_min_prompts} must be "
            f"a multiple of {unit} (minibatches x split halves x chunk)"
        )
      if not c.noise.split_every:
        raise ValueError(
            "config.batch.schedule='adaptive' reads the noise tracker: set "
            "config.noise.split_every > 0"
        )
      buckets = controller.buckets(b.adaptive_min_prompts, b.adaptive_max_prompts)
      if P not in buckets:
        raise ValueError(
            f"config.batch.num_prompts={P} (the adaptive run's first batch) is "
            f"not one of its buckets {buckets} (config.batch.adaptive_min_prompts"
            f"={b.adaptive_min_prompts} x 2^j <= config.batch.adaptive_max_prompts"
            f"={b.adaptive_max_prompts})"
        )
      if b.adaptive_round_time != "measured":
        try:
          systems.get_accelerator(b.adaptive_round_time)
        except ValueError as e:
          raise ValueError(
              f"config.batch.adaptive_round_time={b.adaptive_round_time!r} is neither "
              f"'measured' nor a known accelerator: {e}"
          ) from None
      if b.adaptive_signal == "b_crit" and not (
          math.isfinite(b.adaptive_b_crit_ratio) and b.adaptive_b_crit_ratio > 0
      ):
        raise ValueError(
            "config.batch.adaptive_signal='b_crit' needs config.batch."
            "adaptive_b_crit_ratio > 0 (B_crit / B_noise from an on-policy study), "
            f"got {b.adaptive_b_crit_ratio!r}"
        )
    if c.rl.algo == "ppo" and not c.model.value_head:
      raise ValueError("config.rl.algo='ppo' needs config.model.value_head=True")
    if (c.rl.algo == "ppo") != (c.rl.advantage == "gae"):
      raise ValueError(
          f"config.rl.advantage={c.rl.advantage!r} with config.rl.algo="
          f"{c.rl.algo!r}: PPO's advantages are GAE (advantage='gae'), "
          "and GAE needs PPO's critic"
      )
  try:
    sharding.parse_rules(c.mesh.rules)
  except ValueError as e:
    raise ValueError(f"config.mesh.rules={c.mesh.rules!r}: {e}") from None
