"""Fuzzing the profile loader: any corruption of a valid document loads or fails as a ProfileError."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.errors import ProfileError
from parsim.profile import Profile, from_json, load_profile

VALID = json.loads(json.dumps(load_profile().to_json()))  # as stored: the CPU section's core counts are strings
junk = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(allow_nan=True),
                 st.text(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(doc, prefix=()):
    """Every key path in a nested dict."""
    for key, value in doc.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))


PATHS = sorted(_paths(VALID))


def _mutate(doc: dict, path: tuple, value, delete: bool) -> dict:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@given(path=st.sampled_from(PATHS), value=junk, delete=st.booleans())
@settings(max_examples=300, deadline=None)
def test_corrupted_field_loads_or_raises_profile_error(path, value, delete):
    doc = _mutate(VALID, path, value, delete)
    try:
        assert isinstance(from_json(doc), Profile)
    except ProfileError as e:
        assert str(e) and "\n" not in str(e)


@given(cut=st.integers(0, len(json.dumps(VALID)) - 1))
@settings(max_examples=100, deadline=None)
def test_truncated_file_raises_profile_error(tmp_path_factory, cut):
    path = tmp_path_factory.mktemp("p") / "cut.json"
    path.write_text(json.dumps(VALID)[:cut])
    try:
        load_profile(path)
    except ProfileError:
        return
    raise AssertionError("a truncated profile loaded")
