"""Parallelism applied from outside the model: process group and mesh (dist), float8, activation
checkpointing, compile and FSDP2 (parallelize). See docs/parallelism.md.
Import the submodules themselves: this package loads none of them (FSDP and DCP imports are slow).
"""
