"""Environments for the JAX subprocesses tests launch: the caller's
environment (the session's compile cache and XLA flags, tests/conftest.py)
plus N fake host devices on the CPU."""

import os


def host_devices(n: int) -> dict:
  flags = os.environ.get("XLA_FLAGS", "")
  return dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip(),
  )
