"""Question: Where is conversation.search's recall limited: which query-side variants help, and
what do oracle rankings reach?

    python -m bench.studies.retrieval_ceiling [--data locomo10|longmemeval_oracle] [--models minilm,e5-small]

Result: printed; kept as bench/results/<date>-retrieval-study-<data>.txt (last:
2026-12-04-retrieval-study-locomo.txt).

Where conversation.search's recall is limited: an offline replica of its rankings,
the query-side variants tried on them, and the oracle ceilings.

Everything runs in this process, on the same data bench/studies/retrieval.py loads (one
namespace per LoCoMo conversation or LongMemEval question): the lexical leg replicated
with Loom's own tokeniser, stemmer, stop-words and ordering (distinct query terms
held, then BM25 k1 1.2, b 0.75, per-namespace statistics: it reproduces the leg's
LoCoMo recall@5 through the API, 0.547 against 0.546), exact cosine ranking with each
bundled model (turns embedded as "Speaker: text", LOOM_EMBED_SPEAKER_PREFIX with
metadata.speaker; vectors cached in bench/.cache), and fusions of the two. Printed per
variant: recall@1/5/10, and ``oracle5@20`` / ``oracle5@50``, the recall@5 a perfect
re-ranker would reach over that variant's first 20 / 50 candidates (the ceiling of any
re-ranking stage fed by it; `rerank: true` orders 20).

Variants (each a retrieval engineer's first try; docs/search.md says which were kept):
``prf``: pseudo-relevance feedback (the 10 best terms of the 5 first hits, weight 0.3);
``vocab``: expansion from the namespace's own vocabulary (terms sharing a query term's
first 5 letters, weight 0.5); ``neighbours``: a matched turn gains 0.3 of its adjacent
turns' BM25 (same thread); ``rrf``: reciprocal-rank fusion as hybrid mode runs it;
``combsum``: normalised score fusion (0.3 cosine, 0.7 BM25, over each leg's best 50).
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.studies.retrieval import Question, Turn, data_path, read  # noqa: E402
from loom.store import bm25 as B  # noqa: E402

CACHE = ROOT / "bench" / ".cache" / "study"
Ranker = Callable[[Question, int], list[int]]


class Study:
    def __init__(self, data: str, models: list[str]) -> None:
        ds = read(data_path(data), 0)
        self.name = data
        self.docs: list[tuple[str, Turn]] = [(ns, t) for ns, ts in ds.turns.items() for t in ts]
        self.qs = [q for q in ds.questions if q.answers]
        self.by_ns: dict[str, list[int]] = collections.defaultdict(list)
        for i, (ns, _) in enumerate(self.docs):
            self.by_ns[ns].append(i)
        self.pos = {i: j for idx in self.by_ns.values() for j, i in enumerate(idx)}
        self.terms = [[B.py_stem(x) for x in B.py_terms(self._indexed(t))] for _, t in self.docs]
        self.tf = [collections.Counter(d) for d in self.terms]
        self.stats = {}
        for ns, idx in self.by_ns.items():
            df: collections.Counter[str] = collections.Counter()
            for i in idx:
                df.update(set(self.terms[i]))
            self.stats[ns] = (len(idx), sum(len(self.terms[i]) for i in idx) / len(idx), df)
        self.vectors = {m: self._embed(m) for m in models}

    @staticmethod
    def _indexed(t: Turn) -> str:
        return f"{t.speaker[:64]} {t.content}" if t.speaker else t.content

    def _embed(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        """(turn vectors, question vectors) of `model`, cached per data set."""
        path = CACHE / f"{self.name}-{model}.npz"
        if path.exists():
            got = np.load(path)
            return got["D"], got["Q"]
        from loom.providers.embedders import build_embedder, query_vectors, single_threaded

        emb = build_embedder(model, **single_threaded(model))
        texts = [(f"{t.speaker}: " if t.speaker else "") + t.content[:2048] for _, t in self.docs]
        d = np.vstack([emb.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)])
        q = query_vectors(emb, [q.text for q in self.qs])
        CACHE.mkdir(parents=True, exist_ok=True)
        np.savez(path, D=d, Q=q)
        return d, q

    # -- rankings --------------------------------------------------------------------

    def bm25(
        self, ns: str, terms: list[str], weights: dict[str, float] | None = None
    ) -> dict[int, tuple[int, float]]:
        n, avg, df = self.stats[ns]
        out = {}
        for i in self.by_ns[ns]:
            score, matched = 0.0, 0
            for t in set(terms):
                f = self.tf[i].get(t, 0)
                if f:
                    matched += 1
                    idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                    norm = f * 2.2 / (f + 1.2 * (0.25 + 0.75 * len(self.terms[i]) / avg))
                    score += (weights or {}).get(t, 1.0) * idf * norm
            if matched:
                out[i] = (matched, score)
        return out

    def lexical(self, q: Question, extra: list[str] | None = None, weight: float = 1.0) -> list[int]:
        terms = B.py_query_terms(q.text, stem=True)
        scored = self.bm25(q.namespace, terms + (extra or []), dict.fromkeys(extra or [], weight))
        own = set(terms)
        return sorted(scored, key=lambda i: (-len(own & set(self.terms[i])), -scored[i][1]))

    def prf(self, q: Question) -> list[int]:
        terms = set(B.py_query_terms(q.text, stem=True))
        n, _, df = self.stats[q.namespace]
        weight: collections.Counter[str] = collections.Counter()
        for i in self.lexical(q)[:5]:
            for t, f in self.tf[i].items():
                if t not in terms and t not in B.STOP_WORDS:
                    weight[t] += f / len(self.terms[i]) * math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
        return self.lexical(q, [t for t, _ in weight.most_common(10)], 0.3)

    def vocab(self, q: Question) -> list[int]:
        terms = B.py_query_terms(q.text, stem=True)
        known = self.stats[q.namespace][2]
        extra = [
            v
            for t in terms
            if len(t) >= 5
            for v in known
            if v != t and v.startswith(t[:5]) and v not in terms
        ]
        return self.lexical(q, extra, 0.5)

    def neighbours(self, q: Question, share: float = 0.3) -> list[int]:
        scored = self.bm25(q.namespace, B.py_query_terms(q.text, stem=True))
        idx = self.by_ns[q.namespace]

        def context(i: int) -> float:
            near = [idx[self.pos[i] + d] for d in (-1, 1) if 0 <= self.pos[i] + d < len(idx)]
            same = [k for k in near if self.docs[k][1].thread_id == self.docs[i][1].thread_id and k in scored]
            return max((scored[k][1] for k in same), default=0.0)

        return sorted(scored, key=lambda i: (-scored[i][0], -(scored[i][1] + share * context(i))))

    def vector(self, q: Question, qi: int, model: str) -> tuple[list[int], dict[int, float]]:
        d, qv = self.vectors[model]
        idx = self.by_ns[q.namespace]
        sims = d[idx] @ qv[qi]
        order = np.argsort(-sims)
        return [idx[j] for j in order], {idx[j]: float(sims[j]) for j in order}

    @staticmethod
    def rrf(lists: list[list[int]], weights: list[float]) -> list[int]:
        score: dict[int, float] = collections.defaultdict(float)
        for ranked, w in zip(lists, weights, strict=True):
            for r, i in enumerate(ranked, 1):
                score[i] += w / (60 + r)
        return sorted(score, key=lambda i: -score[i])

    def combsum(self, q: Question, qi: int, model: str, alpha: float = 0.3, depth: int = 50) -> list[int]:
        lex = self.lexical(q)[:depth]
        bm = self.bm25(q.namespace, B.py_query_terms(q.text, stem=True))
        ranked, sims = self.vector(q, qi, model)
        top = ranked[:depth]
        lo, hi = sims[top[-1]], sims[top[0]]
        best = max((bm[i][1] for i in lex), default=1.0) or 1.0

        def score(i: int) -> float:
            cos = max(0.0, (sims[i] - lo) / max(1e-9, hi - lo))
            return alpha * cos + (1 - alpha) * (bm[i][1] / best if i in bm else 0.0)

        return sorted(set(lex) | set(top), key=lambda i: -score(i))

    # -- scoring ---------------------------------------------------------------------

    def report(self, label: str, rank: Ranker) -> str:
        sums = np.zeros(5)
        for qi, q in enumerate(self.qs):
            found = rank(q, qi)
            ids = [self.docs[i][1].msg_id for i in found]
            sums += [len(q.answers & set(ids[:k])) / len(q.answers) for k in (1, 5, 10)] + [
                min(5, len(q.answers & set(ids[:depth]))) / len(q.answers) for depth in (20, 50)
            ]
        r1, r5, r10, o20, o50 = sums / len(self.qs)
        line = (
            f"{label:<34} recall@1 {r1:.3f}  recall@5 {r5:.3f}  recall@10 {r10:.3f}  "
            f"oracle5@20 {o20:.3f}  oracle5@50 {o50:.3f}"
        )
        print(line, flush=True)
        return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", default="locomo10")
    ap.add_argument("--models", default="minilm,e5-small")
    ap.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    args = ap.parse_args()
    s = Study(args.data, [m for m in args.models.split(",") if m])
    lines = [f"retrieval study: {args.data}, {len(s.docs):,} turns, {len(s.qs)} questions"]
    lines.append(s.report("lexical", lambda q, qi: s.lexical(q)))
    lines.append(s.report("lexical + prf", lambda q, qi: s.prf(q)))
    lines.append(s.report("lexical + vocab", lambda q, qi: s.vocab(q)))
    lines.append(s.report("lexical + neighbours", lambda q, qi: s.neighbours(q)))
    for m in s.vectors:
        lines.append(s.report(f"vector {m}", lambda q, qi, m=m: s.vector(q, qi, m)[0]))
        for share in (0.75, 0.9):
            lines.append(
                s.report(
                    f"rrf {m} lexical share {share}",
                    lambda q, qi, m=m, w=share: s.rrf(
                        [s.vector(q, qi, m)[0][:10], s.lexical(q)[:20]], [1 - w, w]
                    ),
                )
            )
        lines.append(
            s.report(
                f"rrf {m} 50+50 equal",
                lambda q, qi, m=m: s.rrf([s.vector(q, qi, m)[0][:50], s.lexical(q)[:50]], [0.5, 0.5]),
            )
        )
        lines.append(s.report(f"combsum {m}", lambda q, qi, m=m: s.combsum(q, qi, m)))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
