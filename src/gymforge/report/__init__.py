"""Figures and the run summary: SFT plots, score plots, the funnel page."""
