"""Demonstration data: scripted-expert episodes on disk (`demos`) and supervised fine-tuning on them (`sft`)."""
