"""Tokenizers: a character-level one for the synthetic tasks, and a thin
wrapper over a Hugging Face `tokenizers.Tokenizer` for real checkpoints.

Both share one interface (`Tokenizer`): `vocab_size`, `pad_id`, `bos_id`,
`eos_id`, `encode(text) -> list[int]` (no special tokens added: the caller
places BOS/EOS) and `decode(ids) -> str`, which skips pad/BOS, stops at the
first EOS and never raises (ids outside the vocabulary become U+FFFD), so it
can be applied to raw sampler output.
"""

from __future__ import annotations

import abc
import os
from typing import Iterable

REPLACEMENT_CHAR = "\ufffd"


def _as_int(x) -> int | None:
  """int(x), or None where x is not an integer-like value."""
  try:
    return int(x)
  except (TypeError, ValueError, OverflowError):
    return None


class Tokenizer(abc.ABC):
  """Common tokenizer interface."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids, special tokens included (ids 0..vocab_size-1)."""

  @property
  @abc.abstractmethod
  def pad_id(self) -> int:
    """Id of the padding token."""

  @property
  @abc.abstractmethod
  def bos_id(self) -> int:
    """Id of the beginning-of-sequence token."""

  @property
  @abc.abstractmethod
  def eos_id(self) -> int:
    """Id of the end-of-sequence token."""

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without BOS/EOS."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`: skips pad/BOS, stops at the first EOS, never
    raises."""


class CharTokenizer(Tokenizer):
  """One id per character: pad=0, bos=1, eos=2, then the alphabet from 3.

  The alphabet is deduplicated keeping first occurrences, so a character's
  id is stable for a given alphabet string. Any single code point may be in
  the alphabet, '\\n' included.
  """

  PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
  NUM_SPECIAL = 3

  def __init__(self, alphabet: str):
    if not isinstance(alphabet, str) or not alphabet:
      raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
    self.alphabet = "".join(dict.fromkeys(alphabet))  # ordered dedupe
    self._char_to_id = {c: i + self.NUM_SPECIAL for i, c in enumerate(self.alphabet)}
    self._id_to_char = {i: c for c, i in self._char_to_id.items()}

  @property
  def vocab_size(self) -> int:
    return self.NUM_SPECIAL + len(self.alphabet)

  @property
  def pad_id(self) -> int:
    return self.PAD_ID

  @property
  def bos_id(self) -> int:
    return self.BOS_ID

  @property
  def eos_id(self) -> int:
    return self.EOS_ID

  def encode(self, text: str) -> list[int]:
    ids = []
    for i, ch in enumerate(text):
      tid = self._char_to_id.get(ch)
      if tid is None:
        raise ValueError(
            f"character {ch!r} at index {i} is not in the " f"tokenizer alphabet {self.alphabet!r}"
        )
      ids.append(tid)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    try:
      it = iter(ids)
    except TypeError:
      return ""
    out = []
    for x in it:
      i = _as_int(x)
      if i == self.EOS_ID:
        break
      if i == self.PAD_ID or i == self.BOS_ID:
        continue
      out.append(self._id_to_char.get(i, REPLACEMENT_CHAR))
    return "".join(out)

  def __repr__(self) -> str:
    return f"CharTokenizer(vocab_size={self.vocab_size})"


class HFTokenizer(Tokenizer):
  """Wraps a Hugging Face `tokenizers.Tokenizer` (optional dependency).

  Args:
    tokenizer: path to a `tokenizer.json`, or a `tokenizers.Tokenizer`.
    pad_token, bos_token, eos_token: the special token strings; each must be
      in the vocabulary (the error names the one that is not). They may
      coincide (e.g. pad == eos, common in LLM checkpoints); decode then
      treats the shared id as EOS.

  `encode` adds no special tokens, whatever the tokenizer's post-processor
  would add. `decode` decodes maximal runs of in-vocabulary ids with
  `tokenizers` and puts one U+FFFD for each out-of-range id between them.
  """

  def __init__(
      self, tokenizer, pad_token: str = "<pad>", bos_token: str = "<bos>", eos_token: str = "<eos>"
  ):
    try:
      import tokenizers  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError(
          "HFTokenizer needs the `tokenizers` package: " "pip install cbs_jax[hf]"
      ) from e
    if isinstance(tokenizer, (str, os.PathLike)):
      tokenizer = tokenizers.Tokenizer.from_file(os.fspath(tokenizer))
    elif not isinstance(tokenizer, tokenizers.Tokenizer):
      raise ValueError(
          "tokenizer must be a tokenizer.json path or a "
          f"tokenizers.Tokenizer, got {type(tokenizer).__name__}"
      )
    self._tok = tokenizer
    ids = {}
    for arg, tok in (("pad_token", pad_token), ("bos_token", bos_token), ("eos_token", eos_token)):
      tid = tokenizer.token_to_id(tok) if isinstance(tok, str) else None
      if tid is None:
        raise ValueError(f"{arg}={tok!r} is not in the tokenizer vocabulary")
      ids[arg] = tid
    self._pad_id = ids["pad_token"]
    self._bos_id = ids["bos_token"]
    self._eos_id = ids["eos_token"]
    self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def bos_id(self) -> int:
    return self._bos_id

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def hf_tokenizer(self):
    """The wrapped `tokenizers.Tokenizer`."""
    return self._tok

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Iterable[int]) -> str:
    try:
      it = iter(ids)
    except TypeError:
      return ""
    pieces, run = [], []

    def flush():
      if run:
        try:
          pieces.append(self._tok.decode(run, skip_special_tokens=False))
        except Exception:  # pylint: disable=broad-except
          pieces.append(REPLACEMENT_CHAR * len(run))
        run.clear()

    for x in it:
      i = _as_int(x)
      if i == self._eos_id:
        break
      if i == self._pad_id or i == self._bos_id:
        continue
      if i is None or not 0 <= i < self._vocab_size:
        flush()
        pieces.append(REPLACEMENT_CHAR)
      else:
        run.append(i)
    flush()
    return "".join(pieces)

  def __repr__(self) -> str:
    return f"HFTokenizer(vocab_size={self.vocab_size})"
