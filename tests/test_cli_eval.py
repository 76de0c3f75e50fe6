"""tq-eval distortion: the command a user runs, its JSON, and its errors."""

import json

from click.testing import CliRunner

from tq_trtllm.cli.eval import main


def run(*args):
    return CliRunner().invoke(main, ["distortion", *args])


def test_json_output_has_the_documented_keys():
    result = run("--bits", "2", "--dim", "64", "--samples", "2000", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert {"bits", "dim", "kind", "rotation", "mse", "ip_bias", "ip_var"} <= row.keys()
    assert row["bits"] == 2 and row["dim"] == 64 and row["kind"] == "mse"
    # where and how it was measured, as docs/results/quality.jsonl rows record it
    assert {"command", "gpu", "driver", "date", "revision"} <= row.keys()
    assert 0.09 < row["mse"] < 0.14


def test_table_output_names_the_setting():
    result = run("--bits", "3", "--dim", "128", "--samples", "1000", "--kind", "prod")
    assert result.exit_code == 0, result.output
    assert "TurboQuant-prod, 3 bits, dim 128" in result.output


def test_bad_input_is_a_clear_error_not_a_traceback():
    result = run("--bits", "3", "--dim", "100")
    assert result.exit_code != 0
    assert "head_dim 100 is not supported" in result.output
    assert "Traceback" not in result.output
    result = run("--bits", "7", "--dim", "128")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--bits 7 is not a width this command takes: use 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5 or 5" \
        in result.output
    result = run("--bits", "2.5", "--dim", "64", "--kind", "prod")
    assert result.exit_code != 0 and "use 2, 3 or 4 bits" in result.output


def test_fractional_and_5_bit_widths_as_tq_build_takes_them():
    mse = {}
    for bits in ("2", "2.5", "3", "4.5", "5"):
        result = run("--bits", bits, "--dim", "64", "--samples", "2000", "--json")
        assert result.exit_code == 0, result.output
        mse[float(bits)] = json.loads(result.output)["mse"]
    widths = sorted(mse)
    assert all(mse[a] > mse[b] for a, b in zip(widths, widths[1:]))  # more bits, less error
    assert 0.0015 < mse[5.0] < 0.0035  # the 5-bit codebook's error (docs/QUALITY.md#the-5-bit-width)
