"""Reading dumps: only plain data is unpickled, versions and names are checked, errors name the file."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
from fr_factory import dump, healthy, write

from ccld.fr_dump.load import DumpError, decode, load_dir, plain_unpickle, rank_of

DATA = Path(__file__).parent / "data"


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/ccld-pwned-by-pickle",))


def test_plain_data_only() -> None:
    data = {"a": [1, 2.5, None, True, "x", b"y", (1, 2)], "b": {"c": -1}}
    assert plain_unpickle(pickle.dumps(data)) == data
    for bad in (Evil(), OrderedDict(a=1), {"x": Path("/")}):
        with pytest.raises(pickle.UnpicklingError, match="only plain data"):
            plain_unpickle(pickle.dumps(bad))
    assert not Path("/tmp/ccld-pwned-by-pickle").exists()


def test_real_gloo_dumps_load_with_the_restricted_unpickler() -> None:
    loaded = load_dir(DATA / "gloo_h1_sleep_rank2")
    dumps = loaded.dumps
    assert loaded.errors == [] and [d.rank for d in dumps] == [0, 1, 2, 3]
    assert all(d.version.startswith("2.") and d.entries for d in dumps)
    assert {e["state"] for d in dumps for e in d.entries} == {"scheduled"}  # gloo never fills it


def test_names_with_and_without_hosts() -> None:
    assert rank_of(Path("nccl_trace_rank_12"))[0] == 12
    assert rank_of(Path("rank3.pkl"))[0] == 3
    assert rank_of(Path("node-a.trace.7.json"))[0] == 7
    with pytest.raises(DumpError, match="rank number"):
        rank_of(Path("notes.txt"))
    loaded = load_dir(DATA / "gloo_h1_sleep_rank1_json")
    assert loaded.errors == [] and loaded.skipped == []
    assert [(d.rank, d.host) for d in loaded.dumps] == [(0, "hostA"), (1, "hostA"), (2, "hostB"), (3, "hostB")]
    assert {d.host for d in load_dir(DATA / "gloo_h2_op_rank2").dumps} == {""}


def test_bad_files_are_named_and_the_rest_is_read(tmp_path: Path) -> None:
    write(tmp_path, {0: dump(healthy(3)), 1: dump(healthy(3))})
    (tmp_path / "nccl_trace_rank_2").write_bytes(pickle.dumps(Evil()))
    (tmp_path / "nccl_trace_rank_3").write_text(json.dumps(dump(healthy(3), version="1.0")))
    (tmp_path / "nccl_trace_rank_4").write_bytes(b"\x80\x04garbage")
    (tmp_path / "nccl_trace_rank_5").write_text(json.dumps({"version": "2.10", "entries": [{"state": "x"}]}))
    (tmp_path / "nccl_trace_rank_6").write_text("[1, 2]")
    (tmp_path / "nccl_trace_rank_7.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    (tmp_path / "truth.json").write_text("{}")
    loaded = load_dir(tmp_path)
    assert [d.rank for d in loaded.dumps] == [0, 1] and loaded.skipped == ["truth.json"]
    text = {str(e) for e in loaded.errors}
    for rank, why in [(2, "only plain data"), (3, "version '1.0'"), (4, "cannot decode"), (5, "lacks"), (6, "dict"),
                      (7, "cannot decompress")]:  # fmt: skip
        assert any(f"nccl_trace_rank_{rank}" in t and why in t for t in text), (rank, text)


def test_json_pickle_and_gzip_decode_alike(tmp_path: Path) -> None:
    d = dump(healthy(2))
    assert decode(tmp_path, json.dumps(d).encode()) == json.loads(json.dumps(d))
    assert decode(tmp_path, pickle.dumps(d)) == d
    assert decode(tmp_path, gzip.compress(pickle.dumps(d))) == d
    assert rank_of(Path("rank3.json.gz"))[0] == 3
