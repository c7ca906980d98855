"""Zerolayer: the appliance daemon and its engine."""

__version__ = "0.1.0"
