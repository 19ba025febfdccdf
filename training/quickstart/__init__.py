"""The learning quickstart: GRPO on a local tool-use world, small enough for a 2-core CPU.

    python -m training.quickstart          # what `make quickstart` runs

See training/quickstart/run.py for the stages and docs/quickstart.md for the design.
"""
