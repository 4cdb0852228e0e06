"""Hypothesis strategies shared by the fuzz tests: random bytes, and real samples mutated
the way broken files and misbehaving agents mutate them (lines lost, repeated, cut short,
garbage spliced in, single bytes flipped), so that most inputs get past the first line."""
import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Fuzz runs are bounded (the suite stays fast) and leave no example database in the tree.
FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
FUZZ_DB = settings(FUZZ, max_examples=60)  # each example writes to the database

NASTY_TEXT = st.sampled_from(["", " ", "\t", "\x00", "\xff", "-1", "NaN", "inf", "1e309", "0x", "[", "]", '"', "#",
                              "<script>alert(1)</script>", "9" * 40, "ü", "\u202e", "\r", "\\", "{}", "null"])


@st.composite
def mutated(draw, sample: bytes, max_ops: int = 4):
    lines = sample.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, max_ops))):
        if not lines:
            lines = [b""]
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "repeat", "replace", "cut", "splice", "flip", "truncate"]))
        if op == "delete":
            del lines[i]
        elif op == "repeat":
            lines.insert(i, lines[i])
        elif op == "replace":
            lines[i] = draw(st.one_of(st.binary(max_size=80), st.text(max_size=80).map(str.encode))) + b"\n"
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif op == "splice":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.one_of(NASTY_TEXT.map(str.encode), st.binary(max_size=12))) + lines[i][at:]
        elif op == "flip" and lines[i]:
            at = draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:at] + bytes([draw(st.integers(0, 255))]) + lines[i][at + 1:]
        elif op == "truncate":
            lines = lines[: i + 1]
    return b"".join(lines)


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), NASTY_TEXT,
                      st.text(max_size=30))
JSON_ANY = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                        max_leaves=12)


@st.composite
def mutated_json(draw, document):
    """The document with a few values replaced by any JSON, keys dropped or added."""
    doc = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 4))):
        parent, key = _pick(draw, doc)
        if parent is None:
            return draw(JSON_ANY)
        op = draw(st.sampled_from(["replace", "drop", "add"]))
        if op == "replace":
            parent[key] = draw(JSON_ANY)
        elif op == "drop":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(JSON_ANY)
        else:
            parent.append(draw(JSON_ANY))
    return doc


def _pick(draw, doc):
    """A random (container, key) somewhere in doc, or (None, None) for the root itself."""
    parent, key, node = None, None, doc
    while isinstance(node, (dict, list)) and node and draw(st.integers(0, 3)) > 0:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, draw(st.sampled_from(keys))
        node = node[key]
    return parent, key
