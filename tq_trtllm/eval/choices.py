"""The names and defaults that tq-eval's options offer, free of torch and transformers so that
`tq-eval ppl --help` and `tq-eval needle --help` answer at once.

needle.py takes DEPTHS from here. The reference caches are defined in baselines.py (BASELINES,
which needs torch); their names are listed here in the same order, and
tests/test_cli_help.py checks that the two agree.
"""

BASELINE_NAMES = ("fp16", "fp8", "kivi3", "kivi4", "mse3", "mse4", "prod3", "prod4")
DEPTHS = (0.1, 0.5, 0.9)  # relative depths of the passkey in the filler, asked by default
