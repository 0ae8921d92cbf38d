"""Parallelism applied from outside the model: process group and mesh (dist), float8, activation
checkpointing, compile and FSDP2 (parallelize). See docs/parallelism.md.

Import the submodules themselves: importing this package loads none of them, so a tool that needs only
the memory estimate does not pay for FSDP's and DCP's imports (about 0.6 s of CPU).
"""
