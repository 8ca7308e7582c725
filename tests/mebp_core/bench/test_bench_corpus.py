"""The stdlib docstring corpus: deterministic, non-empty, deduplicated, split disjointly."""

from __future__ import annotations

import json

from mebp_core.bench.corpus import (
    collect_docstrings,
    split_corpus,
    take_prefix,
    write_docstring_corpus,
)

LONG = "x" * 50


def write_tree(root):
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "pkg" / "a.py").write_text(
        f'"""Module a: {LONG}"""\n\nclass C:\n    """Class C: {LONG}"""\n\n'
        f'    def f(self):\n        """short"""\n')
    (root / "pkg" / "b.py").write_text(f'def g():\n    """Class C: {LONG}"""\n')  # a duplicate
    (root / "pkg" / "broken.py").write_text("def (:\n")
    (root / "test" / "test_x.py").write_text(f'"""From a test dir: {LONG}"""\n')


def test_collects_documented_nodes_in_order_deduplicated_and_skips_tests(tmp_path):
    write_tree(tmp_path)
    assert collect_docstrings(tmp_path) == [f"Module a: {LONG}", f"Class C: {LONG}"]


def test_stdlib_corpus_is_deterministic_and_non_empty():
    first = collect_docstrings(max_files=60)
    assert len(first) > 20 and all(len(text) >= 40 for text in first)
    assert len(set(first)) == len(first)
    assert collect_docstrings(max_files=60) == first


def test_split_is_disjoint_complete_and_stable():
    texts = collect_docstrings(max_files=200)
    train, validation = split_corpus(texts, 0.05)
    assert train and validation
    assert not set(train) & set(validation)
    assert sorted(train + validation) == sorted(texts)
    # a text's side does not depend on the others: splitting a subset agrees
    sub_train, sub_validation = split_corpus(texts[::3], 0.05)
    assert set(sub_train) <= set(train) and set(sub_validation) <= set(validation)


def test_take_prefix_keeps_at_least_one_text():
    assert take_prefix(["abc", "def", "ghi"], 7) == ["abc", "def"]
    assert take_prefix(["abcdef"], 2) == ["abcdef"]


def test_write_corpus_jsonl_rows(tmp_path):
    info = write_docstring_corpus(tmp_path, max_files=80, validation_chars=2000)
    rows = {side: [json.loads(line) for line in open(info[side])]
            for side in ("train", "validation")}
    assert len(rows["train"]) == info["train_docstrings"] > 0
    assert len(rows["validation"]) == info["validation_docstrings"] > 0
    assert all(set(row) == {"text"} for side in rows.values() for row in side)
    assert info["validation_chars"] <= 2000 or info["validation_docstrings"] == 1
