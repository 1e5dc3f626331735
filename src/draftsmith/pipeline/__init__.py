"""Whole-pipeline commands: `quickstart` and `pipeline CONFIG.yaml`."""
