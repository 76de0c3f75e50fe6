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
    assert result.exit_code != 0 and "7 is not in the range 1<=x<=4" in result.output
