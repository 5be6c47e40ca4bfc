"""Which embedding model a deployment searches with, and the built-in static model itself
(skipped where the `embeddings` extra is not installed)."""

from pathlib import Path

import pytest

from activities.vault.embedder import (
    BUILTIN,
    EmbedderUnavailable,
    HashingEmbedder,
    StaticEmbedder,
    builtin_available,
    embedder_for,
    load_embedder,
)
from schemas.vault.schema import SearchMode
from schemas.vault.settings import MemorySettings

needs_model = pytest.mark.skipif(not builtin_available(),
                                 reason="the embeddings extra is not installed")


def _memory(mode: SearchMode, embedder: str | None = None) -> MemorySettings:
    return MemorySettings(vault_dir=Path("/nonexistent"), search_mode=mode, embedder=embedder)


def test_bm25_mode_never_embeds_and_the_stand_in_is_chosen_only_by_name():
    assert embedder_for(_memory(SearchMode.BM25, BUILTIN)) is None
    assert embedder_for(_memory(SearchMode.AUTO, "none")) is None
    assert isinstance(embedder_for(_memory(SearchMode.HYBRID, "hashing")), HashingEmbedder)
    assert not isinstance(embedder_for(_memory(SearchMode.AUTO)), HashingEmbedder)
    with pytest.raises(EmbedderUnavailable, match="needs an embedding model"):
        embedder_for(_memory(SearchMode.HYBRID, "none"))
    with pytest.raises(EmbedderUnavailable, match="names no built-in model"):
        load_embedder("minilm-big")


@needs_model
def test_auto_means_the_built_in_model_loaded_once():
    embedder = embedder_for(_memory(SearchMode.AUTO))
    assert isinstance(embedder, StaticEmbedder) and embedder.name == BUILTIN
    assert embedder is load_embedder(None) is load_embedder(BUILTIN)


@needs_model
def test_the_static_model_puts_related_words_near_each_other():
    embedder = load_embedder(BUILTIN)
    assert isinstance(embedder, StaticEmbedder)
    dog, puppy, tax, empty = embedder.embed_array(
        ["my dog loves running in the park", "the puppy plays outside on the grass",
         "the quarterly tax invoice is overdue", "\u2063"])
    assert abs(float(dog @ dog) - 1.0) < 1e-5 and not empty.any()
    assert float(dog @ puppy) > float(dog @ tax) + 0.1
    assert len(embedder.embed(["один", "two"])[0]) == embedder.dims == 256


@needs_model
def test_a_batch_embeds_each_text_as_the_mean_of_its_tokens_vectors():
    import numpy as np

    embedder = load_embedder(BUILTIN)
    assert isinstance(embedder, StaticEmbedder)
    texts = ["the billing migration moves to Friday", "", "ok",
             " ".join(["a long chunk of words repeated"] * 200), "Анна пьёт чай"]
    batch = embedder.embed_array(texts)
    for text, row in zip(texts, batch, strict=True):
        ids = embedder._tok.encode(text, add_special_tokens=False).ids
        if not ids:
            assert not row.any()
            continue
        mean = embedder._table[ids].mean(axis=0)
        assert np.allclose(row, mean / np.linalg.norm(mean), atol=1e-6)
        assert np.allclose(row, embedder.embed_array([text])[0], atol=1e-6)


@needs_model
def test_the_piece_cache_gives_the_tokenizers_own_ids_for_any_text():
    import random

    embedder = load_embedder(BUILTIN)
    assert isinstance(embedder, StaticEmbedder)
    rng = random.Random(3)
    # Whitespace Python splits at and BERT deletes (\x0b \x1c \x85), other whitespace,
    # control and format characters, accents to strip, CJK, special tokens, long words.
    alphabet = [*"abcXYZ éÉñ日本語Анна пьёт!?.,'\"()[]-_\t\n\r\x00\x01\x0b\x0c\x1c\x1f\x7f"
                    "\x85\xa0\u1680\u2003\u2028\u200b\u2063\u3000\ufffd\u0301İΣﬁ①🙂",
                "[CLS]", "[MASK]", "[UNK]", "[cls]", "a" * 120, "straße"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
             for _ in range(2_000)]
    embedder._pieces.clear()
    for batch in (texts, texts):  # pieces new, then known
        want = [e.ids for e in embedder._tok.encode_batch(batch, add_special_tokens=False)]
        assert embedder.token_ids(batch) == want
