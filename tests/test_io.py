"""Files: atomic writes, JSON errors that name the path, job output folders, CSV."""

import pytest


def test_job_dirs(tmp_path):
    from nope_interp.io import job_dirs

    assert job_dirs(tmp_path, "ablate") == (tmp_path / "results" / "ablate", tmp_path / "figures" / "ablate")
    assert not (tmp_path / "results").exists()  # nothing is created


def test_atomic_write_leaves_no_temporary_file_and_replaces(tmp_path):
    from nope_interp.io import atomic_write_text, read_json, write_json

    path = write_json(tmp_path / "a" / "x.json", {"k": [1, 2]})
    assert read_json(path) == {"k": [1, 2]}
    atomic_write_text(path, "{}")
    assert read_json(path) == {} and sorted(p.name for p in path.parent.iterdir()) == ["x.json"]


def test_read_json_names_the_file(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import read_json

    with pytest.raises(NopeInterpError, match="run config not found"):
        read_json(tmp_path / "missing.json", "run config")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(NopeInterpError, match="corrupt.*bad.json"):
        read_json(tmp_path / "bad.json")


def test_to_csv_takes_the_union_of_columns():
    from nope_interp.io import to_csv

    assert to_csv([{"a": 1}, {"b": 2, "a": 3}]).splitlines() == ["a,b", "1,", "3,2"]
