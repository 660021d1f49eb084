"""Shared tiny model config for the model and sampler tests."""

from cbs_jax import model

VOCAB = 20


def tiny_config(max_len=32, **overrides):
  c = model.default_config()
  c.vocab_size = VOCAB
  c.d_model = 32
  c.num_layers = 2
  c.num_heads = 4
  c.num_kv_heads = 2
  c.d_ff = 48
  c.max_len = max_len
  for k, v in overrides.items():
    c[k] = v
  return c
