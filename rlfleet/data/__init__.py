"""Datasets: the scripted-expert demonstration format and its reader (`demos`)."""
