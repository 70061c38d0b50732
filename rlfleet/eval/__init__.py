"""Evaluation: episodes on held-out seeds (`episodes`), reports and the one before/after writer
(`report`), videos (`video`) and `rlfleet eval` (`main`)."""
