"""The version of sera_opt, in the bottom layer so that every module may read it."""

__version__ = "0.1.0"
