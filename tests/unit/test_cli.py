import argparse

import pytest

from mlx_paged.cli.main import build_parser, main
from mlx_paged.cli.serve_args import parse_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4GB", 4 * 10**9),
        ("4G", 4 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1000", 1000),
        ("1.5gb", 1_500_000_000),
        ("2KiB", 2048),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "four GB", "4XB", "-1GB"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_serve_defaults_match_mlx_lm_server():
    args = build_parser().parse_args(["serve"])
    assert (
        args.host,
        args.port,
        args.max_tokens,
        args.decode_concurrency,
        args.prompt_concurrency,
        args.prefill_step_size,
    ) == ("127.0.0.1", 8080, 512, 32, 8, 2048)
    assert args.kv_paged is True and args.model is None and args.api_key is None
    # The decode step's own defaults: compiled steps with the GPU kernels, unfused RoPE.
    assert (args.compile_decode, args.fused_rope) == ("auto", "off")


def test_decode_step_flags_reach_the_engine_config():
    from mlx_paged.cli.serve import engine_config
    from mlx_paged.engine.config import EngineConfig

    args = build_parser().parse_args(["serve", "--compile-decode", "off", "--fused-rope", "auto"])
    config = engine_config(args)
    assert (config.compile_decode, config.fused_rope) == ("off", "auto")
    assert config.step_log is None and config.prefill_itl_ratio is None
    args = build_parser().parse_args(["serve", "--step-log", "s.jsonl", "--prefill-itl-ratio", "3"])
    assert (engine_config(args).step_log, engine_config(args).prefill_itl_ratio) == ("s.jsonl", 3)
    with pytest.raises(ValueError, match="compile_decode must be one of auto, on, off"):
        EngineConfig(compile_decode="yes")


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--kv-paged"], True),
        (["--kv-paged", "on"], True),
        (["--kv-paged", "off"], False),
    ],
)
def test_kv_paged_flag(argv, expected):
    assert build_parser().parse_args(["serve", *argv]).kv_paged is expected


def test_bench_kernels_skip_names_every_column_a_sweep_adds():
    from mlx_paged.bench.kernels import method_names, paged_runs, unknown_skips

    args = build_parser().parse_args(
        [
            "bench",
            "kernels",
            "--kernel",
            "decode_tc_splitk",
            "--kernel",
            "decode_simt",
            "--skip",
            "paged_decode_simt",
            "--skip",
            "torch_sdpa",
        ]
    )
    assert method_names(args) == [
        "paged",
        "paged_decode_tc_splitk",
        "paged_decode_simt",
        "gather_sdpa",
        "paged_read",
        "mlx_sdpa",
        "torch_sdpa",
    ]
    assert paged_runs(args)["paged_decode_tc_splitk"] == dict(kernel="decode_tc_splitk")
    assert unknown_skips(args) == []


def test_bench_kernels_refuses_a_kernel_that_is_not_one(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "kernels", "--kernel", "decode_reduce"])
    assert "invalid choice" in capsys.readouterr().err


def test_bench_kernels_rejects_a_skip_that_matches_no_column(capsys):
    assert main(["bench", "kernels", "--skip", "paged_2pass_p4096"]) == 2
    out = capsys.readouterr().out
    assert "--skip paged_2pass_p4096: no such column" in out and "paged_read" in out


def test_api_key_sources(tmp_path, monkeypatch):
    from mlx_paged.cli.main import build_parser
    from mlx_paged.cli.serve import resolve_api_key
    from mlx_paged.cli.serve_args import API_KEY_ENV

    def key(*argv):
        return resolve_api_key(build_parser().parse_args(["serve", *argv]))

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert key() is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert key() == "from-env"
    assert key("--api-key", "flag") == "flag"
    path = tmp_path / "key"
    path.write_text("from-file\nignored\n")
    assert key("--api-key-file", str(path)) == "from-file"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        key("--api-key-file", str(path))
    with pytest.raises(ValueError, match="not both"):
        key("--api-key", "x", "--api-key-file", str(path))


def _flags():
    from mlx_paged.cli.main import walk_parsers

    skip = (argparse._HelpAction, argparse._SubParsersAction)
    for parser in walk_parsers(build_parser()):
        for action in parser._actions:
            if not isinstance(action, skip):
                yield parser, action


def test_every_flag_has_help_that_shows_its_default():
    flags = list(_flags())
    assert len(flags) > 100  # serve, eight benchmarks, kernels
    for parser, action in flags:
        name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{name} has no help text"
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            text = parser.formatter_class(parser.prog)._get_help_string(action)
            assert "default" in text, f"{name}: its help does not say its default"
    serve_help = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "(default: INFO)" in serve_help
