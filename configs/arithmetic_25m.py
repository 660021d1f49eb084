"""GRPO on 1-2 digit addition with a ~25M-parameter policy: the size at which
the sharded (data, fsdp, tensor) path does real work, small enough for a
2-core CPU to run a few rounds end to end.

    python -m cbs_jax.main --config=configs/arithmetic_25m.py --workdir=runs/a25m
    # the same run over an 8-device mesh (host devices stand in for chips):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m cbs_jax.main \
        --config=configs/arithmetic_25m.py --workdir=runs/a25m_mesh \
        --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2

Model: 8 blocks of width 512 (8 query / 4 key-value heads of 64, SwiGLU
1536), untied embeddings over the 17-symbol character vocabulary:
25,191,936 parameters (tests/test_sharding.py checks the count). Batch:
P=8 prompts x K=8 rollouts; the SFT warm start is short (it only has to
make rewards non-zero), so the run measures the systems path, not learning.

Measured here (2 cores shared with other jobs, load average 9-16, so times
are upper bounds), ``/usr/bin/time -v`` around the commands above:
one device: 9 min 55 s wall (SFT 138 s, RL updates 201 s, generation 25 s),
peak RSS 2.35 GB; the (2, 2, 2) mesh from the same SFT base
(``--config.sft.base_dir=runs/a25m/sft_base``): 16 min 54 s, peak RSS 4.15 GB,
and the same rows: rewards, losses and eval exactly, entropy and
trace_intra to ~1e-7 relative (tests/test_sharding.py, CBS_JAX_SLOW=1).

``get_config("bf16")``: the same with bfloat16 parameters and compute (float32
master weights and Adam moments, see cbs_jax/precision.py).
"""

from cbs_jax import config as config_lib


def get_config(arg=None):
  c = config_lib.base_config()
  c.task.kwargs.min_digits = 1
  c.task.kwargs.max_digits = 2
  c.task.kwargs.ops = "+"

  m = c.model
  m.d_model = 512
  m.num_layers = 8
  m.num_heads = 8
  m.num_kv_heads = 4
  m.d_ff = 1536
  m.max_len = 24  # prompt "99+99=" + BOS, completion "198" + EOS, with room

  c.sft.steps = 40
  c.sft.batch_size = 32
  c.sft.lr = 1e-3
  c.sft.warmup_steps = 5
  c.sft.eval_every = 0

  c.batch.num_prompts = 8  # P
  c.batch.rollouts_per_prompt = 8  # K -> N = 64 rollouts per round
  c.optim.lr = 1e-4
  c.optim.ref_batch = 64

  c.train.num_rounds = 3
  c.train.eval_every = 0  # start and end only
  c.train.eval_prompts = 64
  c.train.checkpoint_every = 3
  c.train.progress = False
  c.noise.split_every = 1
  if arg == "bf16":
    m.dtype = "bfloat16"
    m.param_dtype = "bfloat16"
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; known: 'bf16'")
  return c
