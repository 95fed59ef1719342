"""Gaps found by walking the README's library tour, command line, LoRA and tracking sections as a user would."""

from __future__ import annotations


def test_plot_help_names_every_panel_draw_accepts():
    """``dgrpo plot --help`` lists every panel name that ``--panels`` accepts: each of the plotting module's
    ``PANELS`` and a reward part (``reward/<part>``), which the help once left out though an unknown panel's error
    offered it."""
    from dgrpo.cli import build_parser
    from dgrpo.plotting.draw import PANELS

    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    text = " ".join(sub.choices["plot"].format_help().split())
    assert all(name in text for name in PANELS)
    assert "reward/<part>" in text


def test_data_and_config_without_a_subcommand_name_none_of_the_parsers_internals(capsys):
    """``dgrpo data`` and ``dgrpo config`` without their sub-command exit 2 with a usage line that asks for a COMMAND,
    as ``dgrpo`` alone does: the error named the parser's internal destination (``data_cmd``, ``config_cmd``)."""
    import pytest

    from dgrpo.cli import build_parser

    for cmd in ("data", "config"):
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args([cmd])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "required: COMMAND" in err and "_cmd" not in err, err
