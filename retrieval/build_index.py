"""Build a retrieval index folder from a JSONL corpus: docstore, embeddings, FAISS, BM25.

    python -m retrieval.build_index --corpus corpus.jsonl --out indexes/wiki \\
        [--encoder minilm|NAME_OR_PATH] [--index flat|hnsw|ivfpq|none] [--bm25]

Stages, each resumable: (1) the docstore (corpus validated, malformed lines listed with
their line numbers); (2) passage embeddings in shards of --shard-size rows (an interrupted
build re-encodes only the missing shards); (3) the FAISS index from the shards (cheap: a
different --index later reuses the embeddings); (4) the BM25 Lucene index with --bm25.
`meta.json`, written last, is what the server reads.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retrieval.bm25 import BM25_DIR, build_bm25
from retrieval.dense import INDEX_FILE, KINDS, SHARD_DIR, build_faiss, shard_path, write_shard
from retrieval.docstore import FILES, CorpusError, DocStore, write_docstore
from retrieval.encoders import Encoder, set_cpu_threads

STATE_FILE = "build_state.json"
META_FILE = "meta.json"


class BuildError(ValueError):
    """A build that cannot go on as asked; the message says how to proceed."""


@dataclass
class BuildReport:
    folder: Path
    n_docs: int
    seconds: dict[str, float] = field(default_factory=dict)   # stage -> wall seconds
    shards_encoded: int = 0
    shards_reused: int = 0

    def lines(self) -> list[str]:
        out = [f"index folder {self.folder} ({self.n_docs:,} documents):"]
        for path in sorted(self.folder.iterdir()):
            if not path.name.startswith("."):
                files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
                size = sum(f.stat().st_size for f in files) / 2**20
                what = f"{path.name}/ ({len(files)} files)" if path.is_dir() else path.name
                out.append(f"  {what:<28} {size:10,.1f} MiB")
        if self.shards_encoded or self.shards_reused:
            out.append(f"embedding shards: {self.shards_encoded} encoded, {self.shards_reused} reused from an earlier run")
        out.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
                   + f"; total {sum(self.seconds.values()):.1f} s")
        return out


def build(corpus: str | Path, out: str | Path, encoder=None, index: str = "flat", bm25: bool = False,
          shard_size: int = 50_000, batch_size: int = 64, max_length: int | None = None,
          profile: str | None = None, device: str | None = None, progress: bool = True) -> BuildReport:
    """Build (or resume) the index folder `out`; see the module docstring for the stages.

    `encoder` is a name/path (default: the shipped MiniLM) or a ready `Encoder`.
    """
    if index not in KINDS + ("none",):
        raise BuildError(f"--index {index!r} is unknown; choose one of {KINDS + ('none',)}")
    if index == "none" and not bm25:
        raise BuildError("--index none builds nothing; add --bm25 or pick a dense index kind")
    out = Path(out)
    enc_name = getattr(encoder, "name", encoder) or "minilm"
    state = {"corpus": _fingerprint(corpus, _previous_corpus(out)), "encoder": str(enc_name), "shard_size": shard_size,
             "profile": profile, "max_length": max_length}
    unchanged = _check_state(out, state)
    report = BuildReport(out, 0)
    done = _finished(out, index, bm25) if unchanged else None
    if done is not None:   # built before from the same corpus and settings: nothing to redo
        report.n_docs = int(done.get("n_docs", 0))
        report.seconds["reused"] = 0.0
        return report

    t0 = time.perf_counter()
    if not _docstore_ready(out):
        write_docstore(corpus, out, progress)
    store = DocStore(out)
    report.n_docs = len(store)
    report.seconds["docstore"] = time.perf_counter() - t0

    meta = {"n_docs": len(store), "shard_size": shard_size, "index": None, "bm25": False}
    if index != "none":
        t0 = time.perf_counter()
        enc = _load_encoder(encoder, profile, device, batch_size, max_length)
        _encode_shards(out, store, enc, shard_size, report, progress)
        report.seconds["embeddings"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_faiss(out, len(store), enc.dim, shard_size, index, progress)
        report.seconds[f"faiss {index}"] = time.perf_counter() - t0
        meta.update(index=index, dim=enc.dim, encoder=str(enc.name), encoder_path=str(enc.path),
                    profile=enc.profile.name, max_length=enc.max_length)
    if bm25:
        t0 = time.perf_counter()
        if not (out / BM25_DIR).is_dir():
            build_bm25(out, store, progress=progress)
        report.seconds["bm25"] = time.perf_counter() - t0
        meta["bm25"] = True
    meta.update(_previous_meta(out, meta))
    _write_json(out / META_FILE, meta)
    return report


def _fingerprint(corpus: str | Path, known: dict | None = None) -> dict:
    """The corpus by content: size and sha256.  The hash of `known` (an earlier fingerprint)
    is reused while path, size and mtime are unchanged, so an unchanged big corpus is not
    read again; a rewritten file with the same bytes keeps its fingerprint."""
    path = Path(corpus)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found; pass --corpus a JSONL file of {{\"id\", \"contents\"}} lines")
    st = path.stat()
    fp = {"path": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    if known and known.get("sha256") and all(known.get(k) == fp[k] for k in ("path", "bytes", "mtime_ns")):
        return {**fp, "sha256": known["sha256"]}
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return {**fp, "sha256": digest.hexdigest()}


def _previous_corpus(out: Path) -> dict | None:
    try:
        return json.loads((out / STATE_FILE).read_text()).get("corpus")
    except (OSError, ValueError, AttributeError):
        return None


def _same_corpus(old: dict | None, new: dict) -> bool:
    if not isinstance(old, dict) or old.get("bytes") != new["bytes"]:
        return False
    if old.get("sha256") is None:   # a build state written before content hashes: path and mtime decide
        return old.get("path") == new["path"] and old.get("mtime_ns") == new["mtime_ns"]
    return old["sha256"] == new["sha256"]


def _check_state(out: Path, state: dict) -> bool:
    """Refuse to resume into a folder built from another corpus (by content: size and sha256),
    or whose embedding shards were made with other encoder settings; return whether the
    folder was built with exactly these settings."""
    path = out / STATE_FILE
    unchanged = False
    if path.exists():
        old = json.loads(path.read_text())
        if _same_corpus(old.get("corpus"), state["corpus"]):
            old["corpus"] = state["corpus"]   # same content; path or mtime may differ
        changed = [k for k in state if old.get(k) != state[k]]
        has_shards = any((out / SHARD_DIR).glob("shard-*.npy"))
        if "corpus" in changed or (changed and has_shards):
            raise BuildError(
                f"{out} holds a build with different {', '.join(changed)} "
                f"(was {[old.get(k) for k in changed]}, now {[state[k] for k in changed]}); "
                f"pass a new --out folder or delete {out} to start over")
        unchanged = not changed
    out.mkdir(parents=True, exist_ok=True)
    _write_json(path, state)
    return unchanged


def _finished(out: Path, index: str, bm25: bool) -> dict | None:
    """meta.json of a finished build holding what is asked (dense `index`, bm25), else None."""
    try:
        meta = json.loads((out / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    dense_ok = index == "none" or (meta.get("index") == index and (out / INDEX_FILE).exists())
    bm25_ok = not bm25 or (meta.get("bm25") and (out / BM25_DIR).is_dir())
    return meta if dense_ok and bm25_ok and _docstore_ready(out) else None


def _docstore_ready(out: Path) -> bool:
    return all((out / name).exists() for name in FILES)


def _load_encoder(encoder, profile, device, batch_size, max_length):
    if encoder is not None and not isinstance(encoder, str):
        return encoder
    return Encoder(encoder, profile=profile, device=device, batch_size=batch_size, max_length=max_length)


def _encode_shards(out: Path, store: DocStore, enc, shard_size: int, report: BuildReport, progress: bool) -> None:
    from tqdm import tqdm  # lazy: display only

    n_shards = math.ceil(len(store) / shard_size)
    todo = []
    for i in range(n_shards):
        rows = min(shard_size, len(store) - i * shard_size)
        path = shard_path(out, i)
        done = path.exists() and np.load(path, mmap_mode="r").shape == (rows, enc.dim)
        report.shards_reused += done
        if not done:
            todo.append(i)
    chunk = max(1, enc.batch_size * 4)   # progress granularity, in passages
    total = sum(min(shard_size, len(store) - i * shard_size) for i in todo)
    with tqdm(total=total, unit="doc", desc="embeddings", disable=not progress) as bar:
        for i in todo:
            rows = range(i * shard_size, min(len(store), (i + 1) * shard_size))
            parts = []
            for start in range(rows.start, rows.stop, chunk):
                texts = [store.contents(r) for r in range(start, min(rows.stop, start + chunk))]
                parts.append(enc.encode_passages(texts))
                bar.update(len(texts))
            write_shard(out, i, np.concatenate(parts))
            report.shards_encoded += 1


def _previous_meta(out: Path, meta: dict) -> dict:
    """Keep what an earlier run built and this one did not (e.g. dense, then --bm25 alone)."""
    path = out / META_FILE
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    keep = {}
    if meta["index"] is None and old.get("index"):
        keep.update({k: v for k, v in old.items() if k in ("index", "dim", "encoder", "encoder_path", "profile", "max_length")})
    if not meta["bm25"] and old.get("bm25"):
        keep["bm25"] = True
    return keep


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retrieval.build_index", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help='JSONL file, one {"id", "contents"} object per line')
    p.add_argument("--out", required=True, help="index folder to create or resume")
    p.add_argument("--encoder", default=None, help="minilm (default, shipped), a Hub id or a local model folder")
    p.add_argument("--profile", default=None, help="force an encoder profile: qwen3-embedding, e5 or minilm")
    p.add_argument("--index", default="flat", choices=KINDS + ("none",), help="dense index kind (none: BM25 only)")
    p.add_argument("--bm25", action="store_true", help="also build a BM25 (pyserini/Lucene) index")
    p.add_argument("--shard-size", type=int, default=50_000, help="passages per embedding shard (resume unit)")
    p.add_argument("--batch-size", type=int, default=64, help="passages per encoder forward pass")
    p.add_argument("--max-length", type=int, default=None, help="truncate passages to this many tokens")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=0, help="torch/FAISS threads (default 0: all cores)")
    args = p.parse_args(argv)
    if args.shard_size < 1 or args.batch_size < 1:
        p.error("--shard-size and --batch-size must be >= 1")
    set_cpu_threads(args.threads)
    try:
        report = build(args.corpus, args.out, encoder=args.encoder, index=args.index, bm25=args.bm25,
                       shard_size=args.shard_size, batch_size=args.batch_size, max_length=args.max_length,
                       profile=args.profile, device=args.device)
    except (CorpusError, BuildError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
