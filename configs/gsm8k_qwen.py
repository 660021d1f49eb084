"""GRPO on GSM8K from a Qwen2.5-0.5B checkpoint, for a TPU pod slice / GPU node.

    python -m cbs_jax.main --config=configs/gsm8k_qwen.py --workdir=runs/gsm8k_qwen \
        --config.task.kwargs.path=/data/gsm8k/train.jsonl \
        --config.hf_checkpoint=/data/Qwen2.5-0.5B

(``/data/...`` are placeholders for the user's copies: GSM8K's main/train
jsonl, one {"question", "answer"} object per line, and a Hugging Face
checkpoint directory with config.json, *.safetensors and tokenizer.json.)
On several hosts add ``--config.distributed.enabled=True`` and run the same
command on every host (README: TPU VM pods, multi-GPU hosts).

``get_config("smoke")`` keeps every choice below but shrinks the model (and
the batch) and points at the committed example problems; tests/test_hf.py
runs it from a tiny random Qwen2 checkpoint it writes (``--config.hf_checkpoint``).

What the trainer does with ``hf_checkpoint`` (train.prepare / start_run):
the run's ``config.model`` must describe the checkpoint (every architecture
field is compared with config.json, errors name both sides); the tokenizer is
the checkpoint's (a vocabulary larger than the model's is an error); prompt
and completion lengths are measured in its tokens; there is no SFT warm
start (the checkpoint is the base policy and the KL reference); parameters
are read straight into their mesh shardings, in ``model.param_dtype``.
Prompts are "Q: {question}\nA:" after the tokenizer's BOS (Qwen has none,
so its pad/EOS <|endoftext|>, a document boundary), with no chat template:
this config is for base models.

Choices:
* model: Qwen2.5-0.5B's config.json (896 wide, 24 layers, 14 query / 2
  key-value heads of 64, SwiGLU 4864, RoPE theta 1e6, q/k/v biases, tied
  embeddings, RMSNorm eps 1e-6, vocabulary 151,936) as
  ``hf.model_config_from_hf`` reads it; bfloat16 compute and parameters
  with a float32 master copy and Adam moments (precision.py).
* sampling: temperature 1, at most 512 new tokens (GSM8K solutions are
  ~100-300 Qwen tokens); ``max_len`` 1024 covers the longest GSM8K prompt
  (~250 tokens) + 512.
* batch: P=64 prompts x K=16 rollouts = 1,024 rollouts per round; Adam at
  1e-6 for that batch (``ref_batch``), sqrt rule when P or K change.
* KL penalty off and symmetric clip 0.2 (plain GRPO); split-microbatch noise
  tracker every round; the exact per-rollout path is off (at 0.5B it needs a
  per-rollout gradient per vmap lane; enable with chunk_prompts=1 if memory
  allows); no exact expected-pass eval (GSM8K answers are not enumerable).
* mesh: FSDP over all devices (``fsdp=-1``): parameters, master copy and
  Adam moments sharded over every chip (0.5B x (2 + 4 + 8) bytes ~7 GB in
  all); ``--config.mesh.fsdp=4 --config.mesh.data=-1`` keeps FSDP within
  groups of 4, ``--config.mesh.tensor=2`` adds tensor parallelism.
"""

import ml_collections

from cbs_jax.tasks import gsm8k
from configs import default

# the user's copy of GSM8K (main/train, one {"question", "answer"} object per line)
DATA_PATH = "/data/gsm8k/train.jsonl"
# the user's copy of a Qwen2.5-0.5B checkpoint (config.json, *.safetensors, tokenizer.json)
CHECKPOINT_DIR = "/data/Qwen2.5-0.5B"


def get_config(arg=None):
  c = default.get_config()
  c.hf_checkpoint = CHECKPOINT_DIR  # Hugging Face checkpoint to start from (see above)
  with c.unlocked():
    c.task.name = "gsm8k"
    # replaces arithmetic's kwargs: GSM8KTask takes the data file only
    c.task.kwargs = ml_collections.ConfigDict({"path": DATA_PATH})

  m = c.model  # Qwen2.5-0.5B (hf.model_config_from_hf of its config.json)
  m.vocab_size = 151936  # must match config.json (train.prepare checks every field)
  m.d_model = 896
  m.num_layers = 24
  m.num_heads = 14
  m.num_kv_heads = 2
  m.head_dim = 0  # = 896 / 14 = 64
  m.d_ff = 4864
  m.max_len = 1024  # prompt + completion tokens (train.prepare checks the layout)
  m.rope_theta = 1_000_000.0
  m.rope_scaling = ""
  m.norm_eps = 1e-6
  m.qkv_bias = True
  m.qk_norm = False
  m.tie_embeddings = True
  m.dtype = "bfloat16"  # compute
  m.param_dtype = "bfloat16"  # stored parameters; float32 master + Adam moments

  c.sampling.temperature = 1.0
  c.sampling.max_new_tokens = 512  # completion tokens (0 = the file's longest solution + 1)

  c.rl.algo = "grpo"
  c.rl.advantage = "grpo"
  c.rl.loss = "ppo"
  c.rl.aggregation = "token_mean"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.kl_beta = 0.0

  c.batch.num_prompts = 64  # P
  c.batch.rollouts_per_prompt = 16  # K -> N = 1,024 rollouts per round
  c.batch.num_minibatches = 1

  c.optim.lr = 1e-6  # at ref_batch rollouts
  c.optim.ref_batch = 1024
  c.optim.lr_rule = "sqrt"
  c.optim.warmup_steps = 10
  c.optim.grad_clip = 1.0

  c.train.num_rounds = 500
  c.train.eval_every = 50
  c.train.eval_prompts = 512  # pass@1 SE ~0.02
  c.train.eval_expected = False  # GSM8K answers are not enumerable
  c.train.checkpoint_every = 25
  c.train.progress = False  # pod logs, not a console

  c.noise.split_every = 1
  c.noise.exact_every = 0
  c.noise.chunk_prompts = 1

  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1

  if arg == "smoke":
    c.task.kwargs.path = gsm8k.DEFAULT_PATH
    m.vocab_size = 512  # the tiny checkpoint's (its tokenizer has fewer ids)
    m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.d_ff = 64, 2, 4, 2, 96
    c.sampling.max_new_tokens = 0  # the committed examples' longest solution + 1
    c.batch.num_prompts, c.batch.rollouts_per_prompt = 4, 4
    c.train.num_rounds, c.train.eval_prompts = 2, 8
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; known: 'smoke'")
  return c
