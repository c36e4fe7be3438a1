"""Imported by corpus/142: a DeprecationWarning outside __main__ (hidden by default)."""
import warnings

warnings.warn('depmod is deprecated', DeprecationWarning)
VALUE = 2
