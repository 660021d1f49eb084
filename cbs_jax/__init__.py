"""cbs_jax: the critical batch size of LLM policy optimization.

Import direction (one way): model -> sampling -> tasks -> rl -> objective ->
noise / drift -> batch -> train -> main.
"""
__version__ = "0.1.0"
