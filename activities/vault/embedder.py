"""Embedding models for hybrid search, and which one a deployment uses.

Invariants:
- Nothing here reaches the network: the built-in model's weights and tokenizer are files of
  the installed `keel` package (keel/embeddings/), read with numpy and `tokenizers` (the
  `embeddings` extra). Without that extra Keel searches with BM25 alone and says so once.
- The choice is `embedder_for(settings)`, from KEEL_EMBEDDER and KEEL_MEMORY_SEARCH_MODE:
  unset means the built-in model when it is installed; `hashing` (a test stand-in, not a
  semantic model) is used only when asked for by name; `hybrid` with no model is an error,
  not a silent fall back.
- A model is loaded once per process and spec (`load_embedder` caches it).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import re
import struct
import threading
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

from schemas.vault.schema import SearchMode
from schemas.vault.settings import MemorySettings

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).resolve().parents[2] / "keel" / "embeddings"
BUILTIN = "minilm-l6-static-256"
# What KEEL_EMBEDDER may say besides a built-in name or "module:factory".
AUTO, NONE, HASHING = "auto", "none", "hashing"
INSTALL_HINT = "pip install 'keel[embeddings]'"


class Embedder(Protocol):
    """What hybrid mode needs from an embedding model: a stable name (vectors of another
    name are never compared with its own) and unit-length vectors for texts."""

    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class EmbedderUnavailable(RuntimeError):
    """The model asked for cannot be loaded here; the message says what to install."""


class StaticEmbedder:
    """A static embedding model: a sentence is the mean of its WordPiece tokens' vectors.

    The built-in one is all-MiniLM-L6-v2 distilled to 256 dimensions (scripts/
    build_static_embedder.py): no transformer at run time, so a core embeds thousands of
    short texts a second.
    """

    def __init__(self, folder: Path) -> None:
        try:
            import numpy as np
            from tokenizers import Tokenizer
        except ImportError as err:
            raise EmbedderUnavailable(
                f"the built-in embedding model needs numpy and tokenizers: {INSTALL_HINT}"
            ) from err
        config = json.loads((folder / "config.json").read_text())
        self.name: str = config["name"]
        self.dims: int = int(config["dims"])
        q = np.load(folder / "vectors.npy")
        scale = np.load(folder / "scales.npy")
        self._np = np
        self._table = (q.astype(np.float32) * scale[:, None]).astype(np.float32)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.no_truncation()
        self._tok.no_padding()
        self._lock = threading.Lock()  # a Tokenizer is not to be shared across threads
        # The same ids without character offsets (tokenizers >= 0.21): a fifth less time.
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        self._pieces: dict[str, tuple[int, ...]] = {}  # whitespace-free piece -> its ids

    def embed(self, texts: list[str]) -> list[list[float]]:
        rows: list[list[float]] = self.embed_array(texts).tolist()
        return rows

    def embed_array(self, texts: list[str]) -> Any:
        """The vectors as one float32 array (len(texts) x dims), rows of unit length
        (a text without any known token: a zero row)."""
        np = self._np
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        table = self._table
        # One gather and sum per text: gathering every token of a batch at once and
        # reducing by segment (np.add.reduceat) cost 30x more (a GB of rows for 2,000
        # long chunks, and reduceat along rows is slow).
        for i, ids in enumerate(self.token_ids(texts)):
            if ids:
                table[np.asarray(ids, dtype=np.intp)].sum(axis=0, out=out[i])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's WordPiece ids, the tokenizer's own (`encode(text).ids`, no special
        tokens), from the ids of its whitespace-separated pieces, each piece tokenized once
        per process (`_PIECE_CACHE` of them kept).

        Exact because the BERT pipeline never joins across whitespace: special tokens hold
        none, the normalizer maps each whitespace character to a space (so a piece
        normalizes alone as it does in its text: its characters, accents stripped and
        reordered within it), the pre-tokenizer splits there, and WordPiece sees one
        pre-token at a time. The characters Python splits on that the normalizer deletes
        instead (`_JOINERS`) send their text whole to the tokenizer. The tokenizer's own
        normalizer keeps per-character offsets: ~0.6 ms for a 900-character chunk, 30x
        what the pieces cost once known."""
        with self._lock:  # one cache and one Tokenizer, shared by threads
            return self._token_ids(texts)

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        cache = self._pieces
        if len(cache) > _PIECE_CACHE:
            cache.clear()
        split = [None if _JOINERS.search(text) else text.split() for text in texts]
        seen = set(chain.from_iterable(pieces for pieces in split if pieces is not None))
        new = sorted(p for p in seen if p not in cache)
        whole = [t for t, pieces in zip(texts, split, strict=True) if pieces is None]
        whole_ids: list[list[int]] = []
        if new or whole:
            encoded = self._encode_batch(new + whole, add_special_tokens=False)
            cache.update((p, tuple(e.ids)) for p, e in zip(new, encoded, strict=False))
            whole_ids = [e.ids for e in encoded[len(new):]]
        out: list[list[int]] = []
        rest = iter(whole_ids)
        ids_of = cache.__getitem__
        for pieces in split:
            out.append(next(rest) if pieces is None
                       else list(chain.from_iterable(map(ids_of, pieces))))
        return out


_WORD = re.compile(r"\w+", re.UNICODE)
# Characters str.split() splits at that BERT's normalizer deletes (control characters), so
# the words on either side join: a text holding one is tokenized whole.
_JOINERS = re.compile("[\x0b\x0c\x1c-\x1f\x85]")
# Distinct pieces whose ids a static model keeps (~200 bytes each); past it the cache
# starts again.
_PIECE_CACHE = 200_000


class HashingEmbedder:
    """A dependency-free stand-in: hashed words and character trigrams, L2-normalised.

    For tests of the hybrid plumbing where the real model is not installed; it is no
    semantic model and makes recall worse than BM25 alone, so it is used only by name.
    """

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = struct.unpack("<Q", digest)[0]
        return value % self.dim, (1.0 if (value >> 63) else -1.0)

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * self.dim
            for word in _WORD.findall(text.casefold()):
                padded = f"#{word}#"
                for feature in [f"w:{word}", *(f"t:{padded[i:i + 3]}"
                                               for i in range(len(padded) - 2))]:
                    idx, sign = self._bucket(feature)
                    vec[idx] += sign
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            out.append([v / norm for v in vec])
        return out


def builtin_available() -> bool:
    """Whether the built-in model's runtime (the `embeddings` extra) is installed."""
    try:
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return (MODELS_DIR / BUILTIN / "vectors.npy").exists()


@lru_cache(maxsize=4)
def _static(folder: Path) -> StaticEmbedder:
    """One copy of a static model per process, whatever spec named it."""
    return StaticEmbedder(folder)


@lru_cache(maxsize=8)
def load_embedder(spec: str | None) -> Embedder | None:
    """The embedder `spec` names (cached per process).

    None / "auto": the built-in model when installed, else None (BM25 only). "none": None.
    "hashing": the test stand-in. A built-in name (minilm-l6-static-256): that model, or
    EmbedderUnavailable. "module:factory": a factory returning an Embedder.
    """
    key = (spec or AUTO).strip()
    if key.lower() in (NONE, "off", "bm25"):
        return None
    if key.lower() == AUTO:
        if not builtin_available():
            log.warning("no embedding model installed: long memory searches with BM25 "
                        "alone (%s for hybrid search)", INSTALL_HINT)
            return None
        key = BUILTIN
    if key.lower() == HASHING:
        return HashingEmbedder()
    if (MODELS_DIR / key / "config.json").exists():
        return _static(MODELS_DIR / key)
    if ":" not in key:
        raise EmbedderUnavailable(
            f"KEEL_EMBEDDER={spec!r} names no built-in model ({BUILTIN}), nor "
            "'module:factory', 'hashing', 'auto' or 'none'")
    module_name, _, attr = key.partition(":")
    factory = getattr(importlib.import_module(module_name), attr or "embedder")
    embedder: Embedder = factory()
    return embedder


def embedder_for(memory: MemorySettings) -> Embedder | None:
    """The embedder a deployment's settings choose (None: BM25 only).

    bm25: none. auto (the default): KEEL_EMBEDDER's model, or the built-in one when
    installed. hybrid: the same, and an error when there is none.
    """
    if memory.search_mode == SearchMode.BM25:
        return None
    embedder = load_embedder(memory.embedder)
    if embedder is None and memory.search_mode == SearchMode.HYBRID:
        raise EmbedderUnavailable(
            "KEEL_MEMORY_SEARCH_MODE=hybrid needs an embedding model: "
            f"{INSTALL_HINT}, or name one with KEEL_EMBEDDER")
    return embedder
