"""Acquisition of Stack Exchange questions and answers: official dump files (this package's `dump` module)."""
