"""Bad command-line values get one line naming the flag, never a traceback (issue 17, item 7)."""

from __future__ import annotations

import pytest

from ccld.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["up", "--port", "99999"], "a port is 0 to 65535, got 99999"),
    (["up", "--port", "http"], "not a port number: 'http'"),
    (["up", "--workers", "0"], "must be at least 1, got 0"),
])
def test_a_bad_value_is_refused_at_parse_time_with_the_flag_named(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith(f"argument --{argv[1][2:]}: {says}"), err
